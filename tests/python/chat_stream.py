"""Chat and streaming chat through the official `openai` SDK, against corral.

Usage: chat_stream.py BASE_URL MODEL [MAX_TOKENS]

Run by tests/llama_server.rs with CORRAL_PYTHON. Does one non-streaming chat (asserts a non-empty
choice) and one streaming chat, then prints one JSON line on stdout:

    {"reply": ..., "chunks": N, "content_chunks": K, "times": [...], "content_times": [...],
     "total_s": T, "finish_reason": ..., "streamed_text": ...}

`times` are the arrival times (seconds since the streaming request was sent) of every chunk the
SDK yields, `content_times` those of the chunks that carry text. Exits non-zero on any failure.
"""

import json
import sys
import time

from openai import OpenAI


def main() -> None:
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    base_url, model = sys.argv[1], sys.argv[2]
    max_tokens = int(sys.argv[3]) if len(sys.argv) == 4 else 32
    client = OpenAI(base_url=f"{base_url}/v1", api_key="x", timeout=60.0, max_retries=0)
    messages = [{"role": "user", "content": "Tell me a long story about a fox."}]

    # Non-streaming.
    completion = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
    assert completion.choices, f"no choices: {completion!r}"
    reply = completion.choices[0].message.content
    assert reply, f"empty reply: {completion!r}"

    # Streaming.
    times, content_times, parts = [], [], []
    finish_reason = None
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, stream=True
    )
    for chunk in stream:
        now = time.perf_counter() - started
        times.append(now)
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.delta is not None and choice.delta.content:
            content_times.append(now)
            parts.append(choice.delta.content)
        if choice.finish_reason is not None:
            finish_reason = choice.finish_reason
    total = time.perf_counter() - started
    assert parts, "the stream carried no text"
    assert finish_reason is not None, "the stream ended without a finish_reason"

    print(
        json.dumps(
            {
                "reply": reply,
                "chunks": len(times),
                "content_chunks": len(content_times),
                "times": times,
                "content_times": content_times,
                "total_s": total,
                "finish_reason": finish_reason,
                "streamed_text": "".join(parts),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
