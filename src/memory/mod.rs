//! GPU-memory estimates for models before they are launched, so the fleet
//! can refuse or evict instead of letting llama-server die out of memory;
//! and load deadlines that grow with the weights, so a 70B model is not
//! declared dead while it is still being read from disk.

mod compute;
mod estimate;
pub(crate) mod host;
mod kv;
mod llama_args;
mod params;
mod shape;

use std::time::Duration;

pub use estimate::{estimate_llama, Estimate};
pub use llama_args::parse_llama_args;
pub use params::{estimate_params, parse_bytes, parse_params};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Read speed assumed for weights when nothing better is known: a slow
/// network disk. Only used to stretch deadlines, so erring low is safe.
pub const DEFAULT_LOAD_BANDWIDTH: u64 = 150 * MIB;

/// How long a model may take to become healthy: `explicit` when configured,
/// else the health-check timeout or the time to read the weights at
/// `load_bandwidth_bytes_per_sec`, whichever is longer (0 bandwidth means
/// [`DEFAULT_LOAD_BANDWIDTH`]).
pub fn load_deadline(
    health_check: Duration,
    weights_bytes: u64,
    load_bandwidth_bytes_per_sec: u64,
    explicit: Option<Duration>,
) -> Duration {
    if let Some(d) = explicit {
        return d;
    }
    let bw = match load_bandwidth_bytes_per_sec {
        0 => DEFAULT_LOAD_BANDWIDTH,
        b => b,
    };
    let ms = u128::from(weights_bytes) * 1000 / u128::from(bw);
    health_check.max(Duration::from_millis(ms.min(u128::from(u64::MAX)) as u64))
}

/// `n` bytes as llama.cpp prints them (`9.70 MiB`), or GiB from 1 GiB up.
pub fn format_bytes(n: u64) -> String {
    if n >= GIB {
        format!("{:.2} GiB", n as f64 / GIB as f64)
    } else {
        format!("{:.2} MiB", n as f64 / MIB as f64)
    }
}

/// A human table of an estimate, for `corral estimate`.
pub fn render_estimate(e: &Estimate) -> String {
    let mut s = byte_rows(e);
    s += &format!(
        "layers    {} of {} repeating layers on the GPU\n",
        e.gpu_layers, e.layers
    );
    for n in &e.notes {
        s += &format!("note: {n}\n");
    }
    s
}

/// The table's rows of bytes: each part of the estimate, and the total.
fn byte_rows(e: &Estimate) -> String {
    let row =
        |name: &str, n: u64, extra: String| format!("{name:<10}{:>12}  {extra}\n", format_bytes(n));
    let mut s = String::new();
    s += &row(
        "weights",
        e.weights_bytes,
        format!(
            "on the GPU, of {} in the file(s)",
            format_bytes(e.file_weights_bytes)
        ),
    );
    s += &row(
        "KV cache",
        e.kv_bytes,
        format!("ctx {} in {} slot(s)", e.ctx, e.parallel),
    );
    s += &row(
        "compute",
        e.compute_bytes,
        "graph buffers (heuristic)".into(),
    );
    if e.mmproj_bytes > 0 {
        s += &row("mmproj", e.mmproj_bytes, String::new());
    }
    s += &row("total", e.total_bytes, "GPU memory".into());
    s += &row(
        "host",
        e.host_bytes,
        "weights left on the CPU and KV not offloaded".into(),
    );
    s
}

const USAGE: &str = "usage: corral estimate FILE.gguf [-c N] [-np N] [-ngl N|auto|all] [-ctk T] [-ctv T] [-ub N] [-fa on|off|auto] [--mmproj FILE] [-kvu] [-nkvo]";

/// `corral estimate FILE.gguf [flags]` (args after `estimate`): the flags are
/// llama-server's, so a model's `cmd` can be pasted. Returns the table.
pub fn estimate_command(args: &[String]) -> Result<String, String> {
    let Some((argv, file)) = sort_estimate_args(args)? else {
        return Ok(format!("{USAGE}\n"));
    };
    let mut parsed = parse_llama_args(&argv);
    if let Some(f) = file {
        parsed.model = Some(f.into());
    }
    let path = parsed
        .model
        .clone()
        .ok_or_else(|| format!("no model file given\n{USAGE}"))?;
    let e = estimate_llama(&parsed)?;
    Ok(format!(
        "model     {}\n{}",
        path.display(),
        render_estimate(&e)
    ))
}

/// llama-server's flags (with their values), and the model file when one is named.
type Sorted = (Vec<String>, Option<String>);

/// The command's words, sorted into llama-server's flags and the model file; `None` when help is
/// asked for.
fn sort_estimate_args(args: &[String]) -> Result<Option<Sorted>, String> {
    let mut argv: Vec<String> = Vec::new();
    let mut file = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
        if a == "-h" || a == "--help" {
            return Ok(None);
        } else if llama_args::takes_value(flag) {
            argv.push(a.clone());
            if !a.contains('=') {
                argv.push(
                    it.next()
                        .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))?
                        .clone(),
                );
            }
        } else if is_switch(a) {
            argv.push(a.clone());
        } else if !a.starts_with('-') && file.is_none() {
            file = Some(a.clone());
        } else {
            return Err(format!("unexpected argument '{a}'\n{USAGE}"));
        }
    }
    Ok(Some((argv, file)))
}

/// The flags of ours that take no value.
fn is_switch(a: &str) -> bool {
    matches!(
        a,
        "-kvu" | "--kv-unified" | "-no-kvu" | "--no-kv-unified" | "-nkvo" | "--no-kv-offload"
    )
}

/// Parses one of llama.cpp's allocation log lines, e.g.
/// `load_tensors:   CPU_Mapped model buffer size =  281.81 MiB` or
/// `0.00.016.036 I llama_kv_cache:   CUDA0 KV buffer size =   256.00 MiB`,
/// into (device/buffer name, kind, bytes). Kinds in build 11434: `model`
/// (load_tensors), `KV` (llama_kv_cache), `RS` (recurrent state), `output`
/// (llama_context, host logits), `compute` (sched_reserve, clip), `LoRA`,
/// `DSV4 <name> state`. Works on prefixed, colored and JSONL lines alike.
pub fn parse_buffer_report(line: &str) -> Option<(String, String, u64)> {
    const KEY: &str = " buffer size =";
    let at = line.find(KEY)?;
    let mut tail = line[at + KEY.len()..].split_whitespace();
    let value: f64 = tail.next()?.parse().ok()?;
    let unit = tail.next()?;
    let unit = unit.split(|c: char| !c.is_ascii_alphabetic()).next()?;
    let scale = match unit {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => MIB,
        "GiB" => GIB,
        _ => return None,
    };
    let head = &line[..at];
    let head = &head[head.rfind(": ").map_or(0, |i| i + 2)..];
    let mut words = head.split_whitespace();
    let device = words.next()?.to_string();
    let kind = words.collect::<Vec<_>>().join(" ");
    if kind.is_empty() || !value.is_finite() || value < 0.0 {
        return None;
    }
    Some((device, kind, (value * scale as f64).round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn load_deadline_grows_with_weights_and_explicit_wins() {
        let hc = S(30);
        assert_eq!(load_deadline(hc, 0, DEFAULT_LOAD_BANDWIDTH, None), hc);
        assert_eq!(
            load_deadline(hc, 150 * MIB * 100, DEFAULT_LOAD_BANDWIDTH, None),
            S(100)
        );
        assert_eq!(load_deadline(hc, 1000 * MIB, MIB, None), S(1000));
        assert_eq!(
            load_deadline(hc, 1000 * MIB, 0, None),
            load_deadline(hc, 1000 * MIB, DEFAULT_LOAD_BANDWIDTH, None)
        );
        let mut last = Duration::ZERO;
        for gib in [0, 1, 4, 16, 64, 256, 1024] {
            let d = load_deadline(hc, gib * GIB, DEFAULT_LOAD_BANDWIDTH, None);
            assert!(d >= last && d >= hc, "{gib} GiB: {d:?}");
            last = d;
        }
        assert!(last > S(6900));
        assert_eq!(load_deadline(hc, 1024 * GIB, 1, Some(S(5))), S(5));
        assert!(load_deadline(hc, u64::MAX, 1, None) > S(1 << 40));
    }

    #[test]
    fn parses_llama_cpp_buffer_lines() {
        let p = parse_buffer_report;
        let t = |d: &str, k: &str, b: u64| Some((d.to_string(), k.to_string(), b));
        assert_eq!(
            p("load_tensors:        CUDA0 model buffer size =  4403.49 MiB"),
            t("CUDA0", "model", 4617393930)
        );
        assert_eq!(
            p("llama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB"),
            t("CUDA0", "KV", 256 * MIB)
        );
        assert_eq!(
            p("llama_context:      CUDA0 compute buffer size =   300.01 MiB"),
            t("CUDA0", "compute", 314583286)
        );
        assert_eq!(
            p("load_tensors:   CPU_Mapped model buffer size =   281.81 MiB"),
            t("CPU_Mapped", "model", 295499203)
        );
        assert_eq!(
            p("llama_context:  CUDA_Host  output buffer size =     0.49 MiB"),
            t("CUDA_Host", "output", 513802)
        );
        assert_eq!(
            p("0.00.123.456 I load_tensors:   CPU_Mapped model buffer size = 0.48 MiB"),
            t("CPU_Mapped", "model", 503316)
        );
        assert_eq!(
            p("0.00.017.722 I sched_reserve:        CPU compute buffer size =     6.02 MiB"),
            t("CPU", "compute", 6312428)
        );
        assert_eq!(p("\x1b[32m0.00.016.036 I llama_kv_cache:        CPU KV buffer size =     2.00 MiB\x1b[0m"), t("CPU", "KV", 2 * MIB));
        assert_eq!(
            p("llama_memory_recurrent:      CUDA0 RS buffer size =    16.00 MiB"),
            t("CUDA0", "RS", 16 * MIB)
        );
        assert_eq!(
            p("llama_kv_cache_dsv4:      CUDA0 DSV4 score state buffer size =     1.00 MiB"),
            t("CUDA0", "DSV4 score state", MIB)
        );
        assert_eq!(
            p(
                r#"{"level":"I","msg":"load_tensors:        CUDA0 model buffer size =     9.70 MiB\n"}"#
            ),
            t("CUDA0", "model", 10171187)
        );
        for no in [
            "",
            "llama_kv_cache: size =    2.00 MiB (   512 cells,   4 layers,  2/2 seqs)",
            "load_tensors: model buffer size = 1.00 MiB",
            "load_tensors:   CPU model buffer size = lots MiB",
            "load_tensors:   CPU model buffer size = 1.0 parsecs",
            "srv  log: buffer size = 4",
        ] {
            assert_eq!(p(no), None, "{no}");
        }
    }

    fn tiny(dir: &std::path::Path) -> std::path::PathBuf {
        let p = dir.join("tiny.gguf");
        gguf::write_tiny_llama(&p, &gguf::TinyOptions::default()).unwrap();
        p
    }

    #[test]
    fn estimate_command_renders_a_table() {
        let dir = tempfile::tempdir().unwrap();
        let m = tiny(dir.path()).display().to_string();
        let args = |s: &str| -> Vec<String> { s.split_whitespace().map(String::from).collect() };
        let out = estimate_command(&args(&format!(
            "{m} -c 1024 -np 2 -ngl 2 -ctk q8_0 -ctv=q8_0"
        )))
        .unwrap();
        for want in [
            "model",
            &m,
            "weights",
            "KV cache",
            "compute",
            "total",
            "ctx 1024 in 2 slot(s)",
            "1 of 2 repeating layers",
            "MiB",
            "note: -ngl 2 of 3",
        ] {
            assert!(out.contains(want), "missing {want:?} in\n{out}");
        }
        assert!(!out.contains("mmproj"), "{out}");
        let same = estimate_command(&args(&format!(
            "-m {m} -c 1024 -np 2 -ngl 2 -ctk q8_0 -ctv q8_0"
        )))
        .unwrap();
        assert_eq!(same, out);
        assert!(estimate_command(&args("--help"))
            .unwrap()
            .starts_with("usage"));
        for (bad, why) in [
            ("", "no model"),
            ("-c 10", "no model"),
            ("x.gguf -c", "needs a value"),
            ("x.gguf --bogus", "unexpected"),
            ("a.gguf b.gguf", "unexpected"),
            ("x.gguf", "x.gguf"),
        ] {
            let err = estimate_command(&args(bad)).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn render_shows_every_part() {
        let e = Estimate {
            weights_bytes: 4 * GIB,
            kv_bytes: 256 * MIB,
            compute_bytes: 300 * MIB,
            mmproj_bytes: 600 * MIB,
            total_bytes: 4 * GIB + 1156 * MIB,
            host_bytes: 700 * MIB,
            file_weights_bytes: 5 * GIB,
            layers: 32,
            gpu_layers: 32,
            ctx: 8192,
            parallel: 4,
            notes: vec!["hello".into()],
        };
        let out = render_estimate(&e);
        for want in [
            "4.00 GiB",
            "of 5.00 GiB",
            "256.00 MiB",
            "300.00 MiB",
            "600.00 MiB",
            "5.13 GiB",
            "32 of 32",
            "ctx 8192 in 4",
            "700.00 MiB",
            "note: hello",
        ] {
            assert!(out.contains(want), "missing {want:?} in\n{out}");
        }
    }
}
