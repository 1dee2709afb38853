use super::*;

fn forwarded(call: Call, v: Value) -> (Asked, Upstream) {
    match translate(call, &v).unwrap() {
        Translated::Forward(asked, up) => (asked, up),
        other => panic!("not forwarded: {other:?}"),
    }
}

#[test]
fn a_chat_becomes_a_streamed_chat_completion_with_its_options() {
    let (asked, up) = forwarded(
        Call::Chat,
        json!({
            "model": "qwen", "messages": [{"role": "user", "content": "hi"}],
            "options": {"temperature": 0.2, "top_k": 20, "top_p": 0.9, "num_predict": 64,
                        "stop": ["\n"], "seed": 7, "num_ctx": 8192, "num_gpu": 99, "num_keep": 4},
            "format": "json", "keep_alive": "10m",
        }),
    );
    assert_eq!(asked.model, "qwen");
    assert!(asked.stream, "Ollama streams unless told not to");
    assert_eq!(
        asked.keep_alive,
        Some(Some(std::time::Duration::from_secs(600)))
    );
    assert_eq!((up.route, up.path), ("/api/chat", "/v1/chat/completions"));
    let b = &up.body;
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"]["include_usage"], true);
    assert_eq!(b["temperature"], 0.2);
    assert_eq!(b["top_k"], 20);
    assert_eq!(b["top_p"], 0.9);
    assert_eq!(b["max_tokens"], 64);
    assert_eq!(b["stop"], json!(["\n"]));
    assert_eq!(b["seed"], 7);
    assert_eq!(b["n_keep"], 4);
    assert_eq!(b["response_format"], json!({"type": "json_object"}));
    assert!(b.get("num_ctx").is_none() && b.get("num_gpu").is_none());
    assert!(b.get("keep_alive").is_none() && b.get("options").is_none());
    assert_eq!(b["messages"], json!([{"role": "user", "content": "hi"}]));
}

#[test]
fn unlimited_prediction_leaves_the_engines_limit() {
    for n in [-1, -2] {
        let (_, up) = forwarded(
            Call::Chat,
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                   "options": {"num_predict": n}, "stream": false}),
        );
        assert!(up.body.get("max_tokens").is_none(), "{n}");
        assert_eq!(up.body["stream"], false);
        assert!(up.body.get("stream_options").is_none());
    }
}

#[test]
fn a_schema_format_asks_for_json_of_that_schema() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let (_, up) = forwarded(
        Call::Chat,
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "format": schema}),
    );
    assert_eq!(up.body["response_format"]["type"], "json_schema");
    assert_eq!(up.body["response_format"]["json_schema"]["schema"], schema);
}

#[test]
fn images_become_image_parts_and_tool_calls_get_ids() {
    let png = "iVBORw0KGgoAAAANSUhEUg==";
    let (_, up) = forwarded(
        Call::Chat,
        json!({"model": "m", "messages": [
            {"role": "user", "content": "what is this", "images": [png, "/9j/4AAQ"]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "content": "cold", "tool_name": "weather"},
        ], "tools": [{"type": "function", "function": {"name": "weather"}}]}),
    );
    let m = &up.body["messages"];
    assert_eq!(
        m[0]["content"][0],
        json!({"type": "text", "text": "what is this"})
    );
    assert_eq!(
        m[0]["content"][1]["image_url"]["url"],
        format!("data:image/png;base64,{png}")
    );
    assert_eq!(
        m[0]["content"][2]["image_url"]["url"],
        "data:image/jpeg;base64,/9j/4AAQ"
    );
    let call = &m[1]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Oslo"}));
    assert_eq!(m[2]["tool_call_id"], call["id"]);
    assert_eq!(up.body["tools"][0]["function"]["name"], "weather");
}

#[test]
fn a_generate_is_a_chat_unless_raw() {
    let (_, up) = forwarded(
        Call::Generate,
        json!({"model": "m", "prompt": "why", "system": "be brief", "think": false}),
    );
    assert_eq!(
        (up.route, up.path),
        ("/api/generate", "/v1/chat/completions")
    );
    assert_eq!(
        up.body["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "why"}])
    );
    assert_eq!(up.body["chat_template_kwargs"]["enable_thinking"], false);
    let (_, raw) = forwarded(
        Call::Generate,
        json!({"model": "m", "prompt": "once upon", "raw": true}),
    );
    assert_eq!(raw.path, "/v1/completions");
    assert_eq!(raw.body["prompt"], "once upon");
}

#[test]
fn embeddings_take_their_input_or_prompt() {
    let (asked, up) = forwarded(Call::Embed, json!({"model": "e", "input": ["a", "b"]}));
    assert!(!asked.stream);
    assert_eq!((up.route, up.path), ("/api/embed", "/v1/embeddings"));
    assert_eq!(up.body, json!({"model": "e", "input": ["a", "b"]}));
    let (_, old) = forwarded(Call::Embeddings, json!({"model": "e", "prompt": "a"}));
    assert_eq!(old.body["input"], "a");
    assert_eq!(old.route, "/api/embeddings");
}

#[test]
fn no_prompt_or_messages_only_loads() {
    for (call, v) in [
        (Call::Generate, json!({"model": "m"})),
        (
            Call::Generate,
            json!({"model": "m", "prompt": "", "keep_alive": 0}),
        ),
        (Call::Chat, json!({"model": "m", "messages": []})),
    ] {
        assert!(
            matches!(translate(call, &v), Ok(Translated::LoadOnly(_))),
            "{v}"
        );
    }
}

#[test]
fn bad_requests_say_what_to_fix() {
    let err = |call, v: Value| translate(call, &v).unwrap_err();
    assert_eq!(
        err(Call::Chat, json!({"messages": []})),
        "model is required"
    );
    assert_eq!(
        err(Call::Chat, json!([1])),
        "the request body must be a JSON object"
    );
    assert!(err(Call::Chat, json!({"model": "m", "messages": "hi"})).contains("list"));
    let no_role = err(
        Call::Chat,
        json!({"model": "m", "messages": [{"content": "x"}]}),
    );
    assert_eq!(no_role, "messages[0]: role is required");
    assert!(err(Call::Chat, json!({"model": "m", "keep_alive": "soon"})).contains("keep_alive"));
    let name = translate(Call::Embed, &json!({"name": "old", "input": "x"})).unwrap();
    assert!(matches!(name, Translated::Forward(a, _) if a.model == "old"));
}
