"""`alrkvd-generate`, the offline command line."""
import json
import subprocess
import sys

from backend.tokenizer import Tokenizer


def test_generate_json_chat_and_raw():
    cmd = [sys.executable, "-m", "backend.generate", "--chat", "--prompt", "What is the capital of France?",
           "--prompt", "Name a color.", "--max-tokens", "20", "--temperature", "0", "--json"]
    lines = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout.splitlines()
    outs = [json.loads(line) for line in lines]
    assert len(outs) == 2
    assert outs[0]["text"] == "The capital of France is Paris."
    tok = Tokenizer.load("default")
    for out in outs:  # the text is the decoded ids (the final stop token is not text)
        ids = [t for t in out["token_ids"] if t not in tok.stop_token_ids]
        assert tok.decode(ids) == out["text"]
        assert out["num_output_tokens"] == len(out["token_ids"])


def test_generate_rejects_bad_options():
    r = subprocess.run([sys.executable, "-m", "backend.generate", "--prompt", "hi", "--kv", "nope"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "unknown kv format" in r.stderr
