"""weir.kernels.native.build: the C kernels compile here, and a machine without a compiler keeps the torch path."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from weir.kernels import cpu_small_gemm
from weir.kernels.native import build


def test_a_kernel_compiles_and_loads_once_per_process(tmp_path: Path) -> None:
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    library = build.build("decode_attention", tmp_path)
    assert library.is_file() and library.stat().st_size > 0
    assert build.load("decode_attention") is build.load("decode_attention")  # cached


def test_no_compiler_is_a_warning_and_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(build, "compiler", lambda: None)
    with pytest.raises(build.NativeBuildError, match="no C compiler"):
        build.build("decode_attention", Path("/nonexistent"))
    build.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=build.__name__):
            assert build.load("decode_attention") is None
        assert "torch path is used instead" in caplog.text
    finally:
        build.load.cache_clear()


def test_a_source_that_does_not_compile_names_the_compiler_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    (tmp_path / "broken.c").write_text("int f( {\n")
    monkeypatch.setattr(build, "SOURCE_DIR", tmp_path)
    with pytest.raises(build.NativeBuildError, match="broken.c failed"):
        build.build("broken", tmp_path)


@pytest.mark.parametrize("name", sorted(path.stem for path in build.SOURCE_DIR.glob("*.c")))
def test_every_kernel_source_compiles_here(name: str, tmp_path: Path) -> None:
    """Every `.c` of the folder, its shared header (exp_poly.h) included from beside it."""
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    assert build.build(name, tmp_path).is_file()


def test_a_function_gets_its_argument_types_and_an_int_status(monkeypatch: pytest.MonkeyPatch) -> None:
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    import ctypes

    fn = build.function("small_gemm", "weir_small_gemm_max_rows", [])
    assert fn is not None and fn.restype is ctypes.c_int and fn() == cpu_small_gemm.MAX_ROWS
    monkeypatch.setattr(build, "load", lambda name: None)  # nothing built: no function
    assert build.function("small_gemm", "weir_small_gemm_max_rows", []) is None


def test_an_address_is_the_symbol_another_kernel_can_call(monkeypatch: pytest.MonkeyPatch) -> None:
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    import ctypes

    address = build.address("small_gemm", "weir_small_gemm_max_rows")
    assert address is not None and address > 0
    assert (
        ctypes.CFUNCTYPE(ctypes.c_int)(address)() == cpu_small_gemm.MAX_ROWS
    )  # the function itself, called through its address
    monkeypatch.setattr(build, "load", lambda name: None)  # nothing built: no address
    assert build.address("small_gemm", "weir_small_gemm_max_rows") is None
