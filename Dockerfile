# The warmshell image: the gateway (`warmshell gateway start`) and the supervisor that every
# Kubernetes sandbox pod runs as its entry point (`warmshell supervisor`, set by the driver).
#
#   docker build -t ghcr.io/warmshell/warmshell:0.1.0 .
#
# Runs as the non-root uid/gid 10001, which the Kubernetes driver's pods request (run_as_user).

FROM python:3.11-slim AS build
# The wheel carries the static sandbox agent (copied into every pod by its init container): a C
# compiler, and musl for a small one (setup.py builds it).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev musl-tools \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
# Wheels for warmshell and every dependency, so the runtime stage needs no compiler or cache.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    WARMSHELL_STATE_DIR=/var/lib/warmshell
RUN groupadd --gid 10001 warmshell \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/warmshell --shell /usr/sbin/nologin warmshell \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/warmshell \
    && install -d -o 10001 -g 10001 -m 0755 /workspace
COPY --from=build /wheels /wheels
# The agent on PATH: `warmshell-agent --install DIR` is every sandbox pod's init container.
RUN pip install --no-cache-dir --no-index --find-links=/wheels warmshell && rm -rf /wheels \
    && ln -s "$(python -c 'from warmshell.drivers.local.runtime.agent import installing; print(installing.BUILT_AGENT)')" \
        /usr/local/bin/warmshell-agent
USER 10001:10001
WORKDIR /workspace
ENTRYPOINT ["warmshell"]
CMD ["gateway", "start"]
