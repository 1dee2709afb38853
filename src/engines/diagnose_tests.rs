use super::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn oom_bytes(kind: EngineKind, out: &str) -> Option<u64> {
    match diagnose(kind, out).expect("diagnosed").cause {
        Cause::OutOfMemory { requested_bytes } => requested_bytes,
        c => panic!("not out of memory: {c:?}"),
    }
}

#[test]
fn llama_cpp_cuda_and_rocm() {
    let out = "\
load_tensors: offloading 28 repeating layers to GPU
ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1234.56 MiB on device 0: cudaMalloc failed: out of memory
alloc_tensor_range: failed to allocate CUDA0 buffer of size 1294529536
llama_model_load: error loading model: unable to allocate CUDA0 buffer
main: exiting due to model loading error
";
    let d = diagnose(EngineKind::LlamaCpp, out).unwrap();
    assert_eq!(d.lines.len(), 3, "{:?}", d.lines);
    assert_eq!(
        d.cause,
        Cause::OutOfMemory {
            requested_bytes: Some((1234.56 * MIB as f64).round() as u64)
        }
    );
    assert!(d.to_string().starts_with(
        "out of GPU memory: ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1234.56 MiB"
    ));
    let rocm = "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 512.00 MiB on device 1: hipMalloc failed: out of memory\n";
    assert_eq!(oom_bytes(EngineKind::LlamaCpp, rocm), Some(512 * MIB));
    let bytes_only = "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 8589934592\n";
    assert_eq!(oom_bytes(EngineKind::LlamaCpp, bytes_only), Some(8 * GIB));
}

#[test]
fn torch_engines() {
    let vllm = "\
INFO 05-01 10:00:00 [gpu_model_runner.py:1234] Loading model weights took 14.99 GiB
ERROR 05-01 10:00:03 [core.py:586] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.
";
    assert_eq!(oom_bytes(EngineKind::Vllm, vllm), Some(2 * GIB));
    let old = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)\n";
    assert_eq!(oom_bytes(EngineKind::Tgi, old), Some(20 * MIB));
    let kv = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.\n";
    assert_eq!(oom_bytes(EngineKind::Vllm, kv), None);
    let sglang = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n";
    assert_eq!(oom_bytes(EngineKind::Sglang, sglang), None);
    let share = "ValueError: Free memory on device (59.32/79.15 GiB) on startup is less than desired GPU memory utilization (0.9, 71.24 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n";
    assert_eq!(
        oom_bytes(EngineKind::Vllm, share),
        None,
        "out of memory, size unsaid"
    );
}

#[test]
fn tei_and_vulkan() {
    let tei = "Error: Could not create backend\n\nCaused by:\n    Could not start backend: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n";
    let d = diagnose(EngineKind::Tei, tei).unwrap();
    assert_eq!(
        d.cause,
        Cause::OutOfMemory {
            requested_bytes: None
        }
    );
    assert_eq!(
        d.lines,
        ["Could not start backend: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"]
    );
    let vk = "ggml_vulkan: Device memory allocation of size 4294967296 failed.\nggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory\n";
    assert_eq!(oom_bytes(EngineKind::LlamaCpp, vk), None);
}

#[test]
fn ports_taken() {
    let cases = [
        (
            EngineKind::LlamaCpp,
            "couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080",
        ),
        (EngineKind::Vllm, "OSError: [Errno 98] Address already in use"),
        (
            EngineKind::Sglang,
            "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use",
        ),
        (
            EngineKind::Tgi,
            "Error: Os { code: 98, kind: AddrInUse, message: \"Address already in use\" }",
        ),
        (EngineKind::Tei, "Error: Address already in use (os error 98)"),
        (
            EngineKind::Ollama,
            "Error: listen tcp 127.0.0.1:11434: bind: address already in use",
        ),
    ];
    for (kind, line) in cases {
        let out = format!("starting\n  {line}\nexiting\n");
        let d = diagnose(kind, &out).unwrap_or_else(|| panic!("{kind:?}"));
        assert_eq!(d.cause, Cause::PortTaken, "{kind:?}");
        assert_eq!(d.lines, [line]);
        assert_eq!(d.to_string(), format!("port taken: {line}"));
    }
}

#[test]
fn first_cause_wins_and_nothing_is_none() {
    let out = "OSError: [Errno 98] Address already in use\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB\n";
    let d = diagnose(EngineKind::Vllm, out).unwrap();
    assert_eq!(d.cause, Cause::PortTaken);
    assert_eq!(d.lines.len(), 1);
    assert_eq!(diagnose(EngineKind::Vllm, ""), None);
    let plain =
        "INFO: loading weights\nValueError: unknown architecture Foo\nerror: model file missing\n";
    assert_eq!(diagnose(EngineKind::Vllm, plain), None);
}

#[test]
fn lines_are_capped() {
    let out = "cudaMalloc failed: out of memory\n".repeat(20);
    assert_eq!(
        diagnose(EngineKind::LlamaCpp, &out).unwrap().lines.len(),
        MAX_LINES
    );
}
