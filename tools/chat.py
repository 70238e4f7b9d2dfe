"""The recipe guide's OpenAI client, pointed at a k3deploy endpoint: asks one question, prints the answer.

    python tools/chat.py http://10.77.0.11:8000 "What is the capital of France?"
    python tools/chat.py http://10.77.0.11:8000 --model moonshotai/Kimi-K3 --max-tokens 256 "Hello"
    python tools/chat.py http://10.77.0.11:8000 --api-key-file ~/.k3/api-key "Hello"   # a keyed endpoint

Same client settings as the Kimi-K3 recipe guide (api_key "EMPTY", /v1 base URL, one-hour timeout); the
message is text only, since the guide's sample image URL lies outside the cluster network. An endpoint protected
by an API key (``k3_api_key_file``) gets the key from ``--api-key-file`` (the same file, or a copy of it), else from
``$K3_API_KEY_FILE``; never from the command line, where ``ps`` would show it. A refused key says so in one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_QUESTION = "Hello! Who are you, in one sentence?"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python tools/chat.py", description="Ask a k3deploy endpoint one question "
                                 "with the recipe guide's OpenAI client.")
    ap.add_argument("endpoint", help="the endpoint k3deploy prints, e.g. http://10.77.0.11:8000")
    ap.add_argument("question", nargs="*", help=f"the question (words are joined; default: {DEFAULT_QUESTION!r})")
    ap.add_argument("--model", default="moonshotai/Kimi-K3", help="served model name (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=2048, help="answer length limit (default: %(default)s)")
    ap.add_argument("--api-key-file", default=os.environ.get("K3_API_KEY_FILE"), metavar="PATH",
                    help="file holding the endpoint's API key (k3_api_key_file; default: $K3_API_KEY_FILE, else none)")
    return ap.parse_args(argv)


def api_key(path: str | None) -> str:
    """The key the file holds (one line), or the recipe guide's "EMPTY" without a file."""
    if not path:
        return "EMPTY"
    key = Path(path).expanduser().read_text(encoding="utf-8").strip()
    if not key:
        raise SystemExit(f"{path} holds no API key: write the key there (one line, mode 0600)")
    return key


def main(argv: list[str]) -> int:
    args = parse(argv)
    from openai import AuthenticationError, OpenAI, PermissionDeniedError

    question = " ".join(args.question) or DEFAULT_QUESTION
    client = OpenAI(api_key=api_key(args.api_key_file), base_url=f"{args.endpoint.rstrip('/')}/v1", timeout=3600)
    messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": question}]}]
    start = time.time()
    try:
        response = client.chat.completions.create(model=args.model, messages=messages, max_tokens=args.max_tokens)
    except (AuthenticationError, PermissionDeniedError) as exc:
        sent = f"the key of {args.api_key_file}" if args.api_key_file else "no key"
        print(f"{args.endpoint} answered {exc.status_code}: it requires an API key and refused {sent}: give "
              "--api-key-file the file the deploy's k3_api_key_file names", file=sys.stderr)
        return 2
    print(f"Question: {question}")
    print(f"Response costs: {time.time() - start:.2f}s")
    print(f"Generated text: {response.choices[0].message.content}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
