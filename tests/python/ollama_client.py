"""The official `ollama` Python client against corral's Ollama API.

Usage: ollama_client.py BASE_URL CHAT_MODEL EMBED_MODEL

Run by tests/ollama.rs with CORRAL_PYTHON. Lists the models, chats (whole and streamed),
generates (whole and streamed), embeds (both embedding routes), shows the chat model and lists
the running ones, each through the client's own types (which validate the answers' shapes), then
asks for a model corral does not have. Prints one JSON line on stdout:

    {"listed": [...], "chat": ..., "chat_chunks": N, "chat_done_reason": ..., "chat_eval_count": N,
     "generate": ..., "generate_chunks": N, "embeddings": N, "embedding_dim": N,
     "old_embedding_dim": N, "capabilities": [...], "running": [...], "running_vram": N,
     "missing_status": N, "missing_error": ...}

Exits non-zero on any failure.
"""

import json
import sys

import ollama


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    base_url, chat_model, embed_model = sys.argv[1:]
    client = ollama.Client(host=base_url, timeout=60.0)
    messages = [{"role": "user", "content": "Tell me about foxes."}]
    report = {}

    report["listed"] = [m.model for m in client.list().models]

    whole = client.chat(model=chat_model, messages=messages, stream=False, options={"num_predict": 4})
    assert whole.done, f"not done: {whole!r}"
    assert whole.message.role == "assistant", f"{whole!r}"
    report["chat"] = whole.message.content

    chunks = list(client.chat(model=chat_model, messages=messages, stream=True, options={"num_predict": 4}))
    assert chunks and chunks[-1].done, f"no last chunk: {chunks!r}"
    assert all(not c.done for c in chunks[:-1]), f"done before the end: {chunks!r}"
    report["chat_chunks"] = len(chunks)
    report["chat_done_reason"] = chunks[-1].done_reason
    report["chat_eval_count"] = chunks[-1].eval_count
    report["streamed"] = "".join(c.message.content or "" for c in chunks)

    generated = client.generate(model=chat_model, prompt="Once upon a time", options={"num_predict": 4})
    assert generated.done, f"{generated!r}"
    report["generate"] = generated.response
    pieces = list(client.generate(model=chat_model, prompt="Once", stream=True, options={"num_predict": 3}))
    assert pieces[-1].done, f"{pieces!r}"
    report["generate_chunks"] = len(pieces)

    embedded = client.embed(model=embed_model, input=["a fox", "a hound"])
    report["embeddings"] = len(embedded.embeddings)
    report["embedding_dim"] = len(embedded.embeddings[0])
    report["old_embedding_dim"] = len(client.embeddings(model=embed_model, prompt="a fox").embedding)

    shown = client.show(chat_model)
    report["capabilities"] = list(shown.capabilities or [])
    report["details_format"] = shown.details.format if shown.details else None

    running = client.ps().models
    report["running"] = [m.model for m in running]
    report["running_vram"] = sum(int(m.size_vram or 0) for m in running)

    try:
        client.chat(model="no-such-model", messages=messages, stream=False)
        sys.exit("a missing model answered")
    except ollama.ResponseError as e:
        report["missing_status"] = e.status_code
        report["missing_error"] = e.error

    print(json.dumps(report))


if __name__ == "__main__":
    main()
