"""mlsyskit.core: the shared core (config, telemetry, clock/sim, rpc, storage, memory, console)."""
if __name__ != "mlsyskit.core":  # run from the repo root, `import core` would find this folder
    raise ImportError("import mlsyskit.core, not the bare 'core' folder")

__version__ = "0.1.0"
