"""sitecustomize for processes started by woffload-run: installs the
automatic naming hook (woffload/_auto.py), then runs the sitecustomize that
this one shadows, if any, so a distribution's or virtualenv's own
customisation still happens."""
import os
import sys


def _chain_next() -> None:
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)


def _install_hook() -> None:
    try:
        import woffload._auto  # noqa: F401
    except ImportError:
        # the package sits beside this directory in the source and install trees
        sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from woffload import _auto
    _auto.install()


try:
    _install_hook()
except Exception as e:  # a broken hook must not stop the program
    sys.stderr.write(f"woffload: python hook not installed: {type(e).__name__}: {e}\n")
try:
    _chain_next()
except Exception as e:
    sys.stderr.write(f"Error in sitecustomize (chained by woffload); {type(e).__name__}: {e}\n")
