"""A stand-in for ``python -m sglang.launch_server`` on loopback: the same command line, SGLang's HTTP answers.

Run as ``python tests/sglang_stub.py <launch_server arguments>`` (what :func:`dscout.backends.sglang.server_command`
builds, minus ``python -m sglang.launch_server``). It answers ``GET /health``, ``GET /get_server_info`` (SGLang's
shape: the ``ServerArgs`` fields as a flat dict — ``model_path``, ``served_model_name``, ``port``,
``speculative_algorithm``, ``speculative_draft_model_path``, ``speculative_num_draft_tokens``,
``speculative_num_steps``, ``speculative_eagle_topk`` ... — plus ``internal_states`` and ``version``),
``POST /flush_cache`` and ``POST /generate`` (``output_ids``, ``text`` and ``meta_info`` with ``completion_tokens``,
``e2e_latency``, ``spec_verify_ct``, ``spec_accept_length``). Environment knobs for the tests:

* ``STUB_LIE``: JSON merged over the described identity (a server that is not the method's);
* ``STUB_DIE_AFTER``: exit with code 3 when this many ``/generate`` requests have been answered (a server that
  dies during the warm-up);
* ``STUB_LOG``: a file each ``/generate`` request's input ids are appended to, one JSON list a line (which prompts
  were sent, in order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-draft-model-path", default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--served-model-name", default=None)
    args, _ = p.parse_known_args(argv)
    return args


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    info = {"model_path": args.model_path, "tokenizer_path": args.model_path,
            "served_model_name": args.served_model_name or args.model_path, "host": args.host, "port": args.port,
            "speculative_algorithm": args.speculative_algorithm,
            "speculative_draft_model_path": args.speculative_draft_model_path,
            "speculative_num_draft_tokens": args.speculative_num_draft_tokens,
            "speculative_num_steps": args.speculative_num_steps,
            "speculative_eagle_topk": args.speculative_eagle_topk, "dtype": "bfloat16", "tp_size": 1,
            "max_total_num_tokens": 4096, "internal_states": [{"avg_spec_accept_length": None}],
            "version": "0.5.23-stub"}
    info.update(json.loads(os.environ.get("STUB_LIE", "{}")))
    die_after = int(os.environ.get("STUB_DIE_AFTER", "0") or 0)
    log = os.environ.get("STUB_LOG")
    served = {"n": 0}
    lock = threading.Lock()
    bs = args.speculative_num_draft_tokens or 1

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _json(self, obj, code=200):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._json({})
            elif self.path == "/get_server_info":
                self._json(info)
            else:
                self._json({"error": "not found"}, 404)

        def do_POST(self):
            payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/flush_cache":
                self._json({})
                return
            if self.path != "/generate":
                self._json({"error": "not found"}, 404)
                return
            with lock:
                if die_after and served["n"] >= die_after:
                    os._exit(3)
                served["n"] += 1
                if log:
                    with open(log, "a") as f:
                        f.write(json.dumps(payload["input_ids"]) + "\n")
            n = int(payload["sampling_params"]["max_new_tokens"])
            verify = -(-n // bs)
            self._json({"text": "x" * n, "output_ids": list(range(n)),
                        "meta_info": {"completion_tokens": n, "e2e_latency": 0.01, "spec_verify_ct": verify,
                                      "spec_accept_length": n / verify}})

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
