"""One nvmath binding is imported without nvmath's package initialisers, which later run when anything else
of the package is asked for (see [Note: importing one nvmath binding]). Checked with a package laid out as
nvmath-python is, whose initialisers record that they ran, in a fresh interpreter each."""

import subprocess
import sys
import textwrap

import pytest

FILES = {
    "nvmath/__init__.py": """
        import os
        os.environ["RAN"] = os.environ.get("RAN", "") + "nvmath,"
        def _force_lib_load():
            from nvmath.bindings import _internal
            for lib in ("cublas", "cublasLt"):
                getattr(_internal, lib).loaded  # every binding must be imported by now
        _force_lib_load()
        from nvmath import bindings, linalg
        __version__ = "1.0"
    """,
    "nvmath/linalg/__init__.py": "import nvmath.bindings.cublasLt\nADVANCED = True\n",
    "nvmath/bindings/__init__.py": """
        import os
        os.environ["RAN"] = os.environ.get("RAN", "") + "bindings,"
        from nvmath.bindings import cublas
        from nvmath.bindings import cublasLt
    """,
    "nvmath/bindings/_internal/__init__.py": "",
    "nvmath/bindings/_internal/cublas.py": "loaded = True\n",
    "nvmath/bindings/_internal/cublasLt.py": "loaded = True\n",
    "nvmath/bindings/cublas.py": "from nvmath.bindings._internal import cublas as _c\nNAME = 'cublas'\n",
    "nvmath/bindings/cublasLt.py": "from nvmath.bindings._internal import cublasLt as _c\nNAME = 'cublasLt'\n",
}


def _run(tmp_path, code: str) -> str:
    for name, text in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(PRELUDE) + textwrap.dedent(code)],
                          capture_output=True, text=True,
                          env={"PYTHONPATH": f"{tmp_path}:{sys.path[0] or '.'}", "PATH": "/usr/bin:/bin"},
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


PRELUDE = """
    import os, sys
    sys.path[:0] = os.environ["PYTHONPATH"].split(":")
    from tilewise.backends.cuda.nvmath_bindings import binding
"""


def test_one_binding_without_the_initialisers(tmp_path):
    out = _run(tmp_path, """
        lt = binding("cublasLt")
        print(lt.NAME, os.environ.get("RAN", "none"), binding("cublasLt") is lt)
    """)
    assert out == "cublasLt none True"


@pytest.mark.parametrize("use, expect", [
    ("import nvmath; print(nvmath.__version__)", "1.0"),
    ("from nvmath import linalg; print(linalg.ADVANCED)", "True"),
    ("import nvmath.bindings; print(nvmath.bindings.cublas.NAME)", "cublas"),
    ("from nvmath.bindings import cublas; print(cublas.NAME)", "cublas"),
])
def test_the_package_finishes_when_used(tmp_path, use, expect):
    out = _run(tmp_path, f"""
        lt = binding("cublasLt")
        {use}
        import nvmath
        print(os.environ["RAN"], nvmath.bindings.cublasLt is lt, type(nvmath).__name__)
    """)
    assert out.splitlines() == [expect, "bindings,nvmath, True module"]


def test_an_imported_nvmath_is_used_as_it_is(tmp_path):
    out = _run(tmp_path, """
        import nvmath
        print(binding("cublas").NAME, os.environ["RAN"])
    """)
    assert out == "cublas nvmath,bindings,"  # the ordinary import's order


def test_without_nvmath(tmp_path):
    out = _run(tmp_path, """
        sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p, "nvmath"))]
        try:
            binding("cufft")
        except ImportError as error:
            print("ImportError", "nvmath" in sys.modules)
    """)
    assert out == "ImportError False"


def test_a_second_binding_is_imported_alone_too(tmp_path):
    out = _run(tmp_path, """
        lt = binding("cublasLt")
        blas = binding("cublas")
        print(lt.NAME, blas.NAME, os.environ.get("RAN", "none"))
    """)
    assert out == "cublasLt cublas none"
