"""What the Hydra launcher presets in conf/hydra/launcher/ run in the submitting process, besides the plugin."""
