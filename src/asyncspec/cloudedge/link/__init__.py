"""The emulated asymmetric edge–cloud link (`asyncspec link` and the cloud–edge benchmarks): a
shaping TCP proxy (proxy.py), rates paced by the kernel's tc instead (kernel.py), the proxy as a
child process (process.py), and the weak/medium/strong profiles (profiles.py). Emulation only: the
services never import it."""
