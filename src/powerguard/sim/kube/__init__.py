"""A simulated Kubernetes API server (``python -m powerguard.sim.kube``): the real protocol's
semantics for what PowerGuard's Kubernetes adapter uses, with controllers and kubelets that run
pods as real processes. See ``__main__.py``."""
