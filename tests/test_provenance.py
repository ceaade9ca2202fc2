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


def test_a_module_without_kernel_imports_hashes_its_own_bytes(tmp_path):
    import hashlib

    (tmp_path / "k.py").write_text("from casebook.traffic import Traffic\n")
    assert provenance.kernel_sha256("k", tmp_path) == hashlib.sha256(b"from casebook.traffic import Traffic\n").hexdigest()


def test_kernel_imports_reads_every_import_form():
    src = b"from casebook.kernels import a\nfrom casebook.kernels.b import x\nimport casebook.kernels.c\nfrom .d import y\n"
    assert provenance.kernel_imports(src) == {"a", "b", "c", "d"}
