"""The `loco` console script of the wheel: runs the `loco` program installed beside this
package (loco/bin/loco), with loco-train, the plugins and redis-server next to it.

The programs find LibTorch through their run path when torch sits beside loco in the same
site-packages (a venv, the usual case); when it is elsewhere on sys.path (a system or user
site, another prefix), its lib folder goes on LD_LIBRARY_PATH here, so that they, the nodes
they start and the plugins those load use the torch this Python imports."""
import importlib.util
import os
import sys
from pathlib import Path


def _torch_lib() -> str:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return ""
    lib = Path(spec.origin).resolve().parent / "lib"
    return str(lib) if lib.is_dir() else ""


def main() -> None:
    program = Path(__file__).resolve().parent / "bin" / "loco"
    if not program.exists():
        sys.exit(f"loco: {program} is missing: this loco package has no programs "
                 "(an in-tree build: run build/bin/loco)")
    lib = _torch_lib()
    if lib:
        rest = os.environ.get("LD_LIBRARY_PATH", "")
        os.environ["LD_LIBRARY_PATH"] = lib + (":" + rest if rest else "")
    os.execv(str(program), [str(program), *sys.argv[1:]])


if __name__ == "__main__":
    main()
