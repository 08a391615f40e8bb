"""The sandbox agent and `warmshell-launch`: their C sources, the binaries built from them (package
data of a wheel built with a C compiler), and `building`, which compiles them."""
