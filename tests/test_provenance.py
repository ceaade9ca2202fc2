from casebook import provenance


def test_a_change_to_an_imported_kernel_module_changes_the_hash(tmp_path):
    (tmp_path / "shared_core.py").write_text("BLOCK = 64\n")
    (tmp_path / "user.py").write_text("from casebook.kernels.shared_core import BLOCK\n")
    (tmp_path / "alone.py").write_text("import torch\n")
    before = provenance.kernel_sha256("user", tmp_path)
    alone = provenance.kernel_sha256("alone", tmp_path)
    (tmp_path / "shared_core.py").write_text("BLOCK = 128\n")
    assert provenance.kernel_sha256("user", tmp_path) != before
    assert provenance.kernel_sha256("alone", tmp_path) == alone


def test_a_change_two_imports_away_changes_the_hash(tmp_path):
    """user imports gemm, which imports gelu: an edit to gelu stales user's results too."""
    (tmp_path / "gelu.py").write_text("FORM = 'erf'\n")
    (tmp_path / "gemm.py").write_text("from casebook.kernels import gelu\n")
    (tmp_path / "user.py").write_text("from casebook.kernels import gemm\n")
    before = provenance.kernel_sha256("user", tmp_path)
    (tmp_path / "gelu.py").write_text("FORM = 'tanh'\n")
    assert provenance.kernel_sha256("user", tmp_path) != before


def test_import_cycles_end(tmp_path):
    (tmp_path / "a.py").write_text("from casebook.kernels import b\n")
    (tmp_path / "b.py").write_text("from casebook.kernels import a\n")
    assert provenance.kernel_sha256("a", tmp_path) != provenance.kernel_sha256("b", tmp_path)


def test_a_module_without_kernel_imports_hashes_its_own_bytes(tmp_path):
    import hashlib

    (tmp_path / "k.py").write_text("from casebook.traffic import Traffic\n")
    assert provenance.kernel_sha256("k", tmp_path) == hashlib.sha256(b"from casebook.traffic import Traffic\n").hexdigest()


def test_kernel_imports_reads_every_import_form():
    src = b"from casebook.kernels import a\nfrom casebook.kernels.b import x\nimport casebook.kernels.c\nfrom .d import y\n"
    assert provenance.kernel_imports(src) == {"a", "b", "c", "d"}
