"""Where build steps run: the `Runner` protocol and its shared parts (farm/runners/base.py), the
container runner (container.py: the builder image through the engine, engine.py, images.py,
emulation.py for aarch64 under QEMU) and the host runner (host.py). Both run the same entrypoint,
`python -m farm.build.steps`."""
