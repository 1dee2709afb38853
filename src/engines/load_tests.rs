use super::*;

fn load(kind: EngineKind, body: &str) -> Option<(u64, u64)> {
    read_load(kind, body).map(|l| (l.running, l.waiting))
}

#[test]
fn llama_cpp_metrics_and_slots() {
    let body = "\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
";
    assert_eq!(load(EngineKind::LlamaCpp, body), Some((2, 3)));
    let slots = r#"[{"id":0,"n_ctx":4096,"is_processing":true},{"id":1,"n_ctx":4096,"is_processing":false}]"#;
    assert_eq!(load(EngineKind::LlamaCpp, slots), Some((1, 0)));
    assert_eq!(read_capacity(EngineKind::LlamaCpp, slots), Some(2));
    assert_eq!(read_capacity(EngineKind::Vllm, slots), None);
}

#[test]
fn vllm_sums_engines_and_ignores_longer_names() {
    let body = "\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"qwen\"} 3.0
vllm:num_requests_running{engine=\"1\",model_name=\"qwen\"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"qwen\"} 2.0
vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9.0
vllm:gpu_cache_usage_perc{model_name=\"qwen\"} 0.25
";
    assert_eq!(load(EngineKind::Vllm, body), Some((4, 2)));
}

#[test]
fn tgi_running_is_the_batch_and_waiting_the_queue() {
    let body = "\
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 5
# TYPE tgi_queue_size gauge
tgi_queue_size 7
tgi_batch_current_max_tokens 4096
";
    assert_eq!(load(EngineKind::Tgi, body), Some((5, 7)));
}

#[test]
fn sglang_labels_with_spaces_and_odd_values() {
    let body = "\
sglang:num_running_reqs{model_name=\"a model\",dp=\"0\"} 1.0
sglang:num_running_reqs{model_name=\"a model\",dp=\"1\"} 2.0 1700000000000
sglang:num_running_reqs_extra 9
sglang:num_queue_reqs{model_name=\"a model\"} NaN
sglang:num_queue_reqs{model_name=\"b\"} -3
sglang:token_usage{model_name=\"a model\"} 0.37
";
    assert_eq!(load(EngineKind::Sglang, body), Some((3, 0)));
}

#[test]
fn tei_gauges() {
    let body = "te_queue_size 4\nte_batch_current_size 2\nte_request_count{method=\"single\"} 10\n";
    assert_eq!(load(EngineKind::Tei, body), Some((2, 4)));
}

#[test]
fn waiting_absent_reads_as_zero_running_absent_as_none() {
    assert_eq!(
        load(EngineKind::Tei, "te_batch_current_size 1\n"),
        Some((1, 0))
    );
    assert_eq!(load(EngineKind::Tei, "te_queue_size 1\n"), None);
    assert_eq!(load(EngineKind::Vllm, "<html>not found</html>"), None);
    assert_eq!(load(EngineKind::Vllm, ""), None);
}

#[test]
fn ollama_counts_loaded_models() {
    let body = r#"{"models":[{"name":"qwen3:0.6b","model":"qwen3:0.6b","size":1234,"size_vram":1234,
        "expires_at":"2030-01-01T00:00:00Z"},{"name":"llama3:8b","model":"llama3:8b"}]}"#;
    assert_eq!(load(EngineKind::Ollama, body), Some((2, 0)));
    assert_eq!(load(EngineKind::Ollama, r#"{"models":[]}"#), Some((0, 0)));
    assert_eq!(load(EngineKind::Ollama, "Ollama is running"), None);
}

#[test]
fn custom_reads_nothing() {
    assert_eq!(load(EngineKind::Custom, "x 1\n"), None);
    let r = EngineKind::Custom.load_report();
    assert_eq!((r.path, r.format), (None, LoadFormat::None));
    assert_eq!(
        EngineKind::LlamaCpp.load_report().capacity_path,
        Some("/slots")
    );
}
