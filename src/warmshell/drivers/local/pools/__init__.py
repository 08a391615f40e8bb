"""Warm pools of the local driver: idle members per profile, their liveness, refills and profile
reloading. Members are started and stopped through the fleet (`members`); the driver claims them.
"""
