"""The committed stubs are exactly what tools/gen_stubs.py makes from proto/: they never drift."""

from tools.gen_stubs import ROOT, generate


def test_committed_stubs_match_the_proto_files(tmp_path):
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in generate(tmp_path)}
    committed = {p.relative_to(ROOT): p.read_bytes() for p in (ROOT / "diffusion").rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    assert sorted(map(str, committed)) == sorted(map(str, fresh)), "stub files differ: run `make stubs`"
    stale = [str(path) for path, data in fresh.items() if committed[path] != data]
    assert not stale, f"stubs out of date with proto/: {stale}; run `make stubs`"

def test_every_proto_file_has_stubs():
    protos = {p.stem for p in (ROOT / "proto" / "diffusion" / "v1").glob("*.proto")}
    modules = {p.name.removesuffix("_pb2.py") for p in (ROOT / "diffusion" / "v1").glob("*_pb2.py")}
    assert protos == modules and protos >= {"common", "broker", "inference", "training"}
