"""mlsyskit.tools: the four tools (offload, fl, sched, kv)."""
if __name__ != "mlsyskit.tools":  # run from the repo root, `import tools` would find this folder
    raise ImportError("import mlsyskit.tools, not the bare 'tools' folder")
