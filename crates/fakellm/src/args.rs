//! Command line parsing for fakellm.
//!
//! The parser is deliberately forgiving: unknown flags are ignored with a
//! warning (so a real `llama-server` command line can be pointed at fakellm),
//! but an unknown `--flag` that is followed by a value consumes that value.

/// Everything fakellm can be told on its command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub port: u16,
    pub host: String,
    pub model: Option<String>,
    pub require_model: bool,
    pub alias: String,
    pub slots: usize,
    pub ctx_size: u64,
    /// `--kv-unified`: every slot may use the whole context, as `/props` then reports.
    pub kv_unified: bool,
    /// What `/props` reports as a request's context, instead of the context per slot (an engine
    /// that fitted a smaller context than it was told).
    pub props_n_ctx: Option<u64>,
    pub loading_ms: u64,
    pub progress_ms: u64,
    pub never_healthy: bool,
    pub exit_after_ms: Option<u64>,
    pub exit_code: i32,
    pub stderr_lines: u64,
    pub chunks: u64,
    pub chunk_interval_ms: u64,
    pub response_delay_ms: u64,
    pub abort_after_chunks: Option<u64>,
    pub completion_status: Option<u16>,
    pub ignore_sigterm: bool,
    pub fork_grandchild: bool,
    pub setpgrp_grandchild: bool,
    pub events_file: Option<String>,
    pub buffer_report: bool,
    pub report_model_mib: f64,
    pub report_kv_mib: f64,
    pub report_compute_mib: f64,
    pub report_devices: Vec<String>,
    pub threads: usize,
    pub embedding_dim: usize,
    /// Close a keep-alive connection that sends no request for this long.
    pub idle_close_ms: Option<u64>,
    /// Keep reporting a slot as processing in `/slots` for this long after its request ended
    /// (llama-server releases a slot a moment after the response is sent).
    pub slots_lag_ms: u64,
    /// The engine imitated (`--imitate`; set from the command line before parsing).
    pub imitate: crate::kind::Kind,
    /// Print the imitated engine's out-of-memory lines after loading, and exit 1.
    pub fail_oom: bool,
    /// Fail out of memory only while this file does not exist (the failure creates it).
    pub fail_oom_once: Option<String>,
    /// Print the imitated engine's port-taken lines at once, and exit 1.
    pub fail_port: bool,
    /// Answer with llama-server's CORS headers: `Access-Control-Allow-Origin` echoing the
    /// request's `Origin` (empty without one) and `Access-Control-Allow-Credentials: true`.
    pub cors: bool,
    /// While loading, answer `/health` with a JSON loading report (`{"progress": F, "message":
    /// "loading tensors"}`, F the fraction of `--loading-ms` passed, in `--progress-ms` steps)
    /// instead of llama-server's 503 "Loading model".
    pub health_progress: bool,
    /// How long a wake from sleep takes (`--wake-ms`).
    pub wake_ms: u64,
    /// vLLM's `--enable-sleep-mode`: its sleep routes exist (with `VLLM_SERVER_DEV_MODE=1`).
    pub enable_sleep_mode: bool,
    /// SGLang's `--enable-memory-saver`: its memory release routes exist.
    pub enable_memory_saver: bool,
    /// llama-server's `--sleep-idle-seconds`: asleep after this long without a request.
    pub sleep_idle_seconds: Option<u64>,
    /// Sleep calls answer 500 (`--fail-sleep`).
    pub fail_sleep: bool,
    /// Wake calls answer 500 (`--fail-wake`).
    pub fail_wake: bool,
    /// Human readable warnings about ignored arguments, printed at startup.
    pub warnings: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            port: 0,
            host: "127.0.0.1".to_string(),
            model: None,
            require_model: false,
            alias: "fakellm".to_string(),
            slots: 1,
            ctx_size: 4096,
            kv_unified: false,
            props_n_ctx: None,
            loading_ms: 0,
            progress_ms: 0,
            never_healthy: false,
            exit_after_ms: None,
            exit_code: 1,
            stderr_lines: 0,
            chunks: 5,
            chunk_interval_ms: 10,
            response_delay_ms: 0,
            abort_after_chunks: None,
            completion_status: None,
            ignore_sigterm: false,
            fork_grandchild: false,
            setpgrp_grandchild: false,
            events_file: None,
            buffer_report: false,
            report_model_mib: 100.0,
            report_kv_mib: 16.0,
            report_compute_mib: 10.0,
            report_devices: Vec::new(),
            threads: 1,
            embedding_dim: 8,
            idle_close_ms: None,
            slots_lag_ms: 0,
            imitate: crate::kind::Kind::LlamaCpp,
            fail_oom: false,
            fail_oom_once: None,
            fail_port: false,
            cors: false,
            health_progress: false,
            wake_ms: 0,
            enable_sleep_mode: false,
            enable_memory_saver: false,
            sleep_idle_seconds: None,
            fail_sleep: false,
            fail_wake: false,
            warnings: Vec::new(),
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    Run(Box<Config>),
    Help,
}

pub const USAGE: &str = "\
usage: fakellm --port N [options]   (an imitation of llama.cpp's llama-server)

  --port N                 port to listen on (required; 0 = any free port)
  --host H                 address to bind (default 127.0.0.1)
  -m, --model PATH         model path (reported in /props; need not exist)
  --require-model          fail like llama-server when the model file is missing
  -a, --alias NAME         model id reported in /v1/models (default fakellm)
  -np, --parallel, --slots N   slot count (default 1)
  -c, --ctx-size N         context size, shared by the slots in /props (default 4096)
  -kvu, --kv-unified       every slot may use the whole context (/props reports it whole)
  --props-n-ctx N          the per-request context /props reports, whatever -c and -np say
  --loading-ms MS          answer 503 'Loading model' for MS after start
  --progress-ms MS         print 'loading: N%' every MS while loading
  --never-healthy          stay in the loading state forever
  --exit-after-ms MS       exit after MS with --exit-code C (default 1)
  --stderr-lines N         print N numbered lines to stderr at startup
  --chunks N               SSE content chunks per stream (default 5)
  --chunk-interval-ms MS   time between SSE chunks (default 10)
  --response-delay-ms MS   delay before inference response headers
  --abort-after-chunks N   SIGKILL itself after streaming N chunks
  --completion-status CODE inference endpoints answer CODE with an error JSON
  --ignore-sigterm         ignore SIGTERM
  --fork-grandchild        spawn `sleep 3600` holding stdout/stderr
  --setpgrp-grandchild     same, but the grandchild leaves the process group
  --events-file PATH       append JSON lines describing what happens
  --buffer-report          print llama.cpp-like buffer size lines after loading
  --report-model-mib F, --report-kv-mib F, --report-compute-mib F
  --report-device NAME[,NAME..]  also report buffers on these devices (e.g. CUDA0)
  --threads N              tokio worker threads (default 1)
  --embedding-dim N        embedding vector size (default 8)
  --idle-close-ms MS       close keep-alive connections idle for MS
  --slots-lag-ms MS        /slots shows a slot busy for MS after its request ended
  --imitate KIND           imitate vllm, tgi, sglang, tei or ollama (default llama_cpp): take
                           that engine's command line, start up as it does, publish its metrics
  --fail-oom               print the engine's out-of-memory lines after loading, exit 1
  --fail-port              print the engine's port-taken lines, exit 1
  --fail-oom-once PATH     as --fail-oom when PATH does not exist, creating it; else start
  --cors                   answer with llama-server's CORS headers (Origin echoed, credentials)
  --health-progress        while loading, /health answers 503 with {\"progress\": F, \"message\": ..}:
                           F is the share of --loading-ms passed, moving in --progress-ms steps
                           (0 for ever with --never-healthy and no --loading-ms)
  --enable-sleep-mode      (vllm) serve /sleep, /wake_up, /is_sleeping, /collective_rpc and
                           /reset_prefix_cache, given VLLM_SERVER_DEV_MODE=1, as vLLM does
  --enable-memory-saver    (sglang) serve /release_memory_occupation, /resume_memory_occupation
  --wake-ms MS             a wake from sleep takes MS (default 0)
  --sleep-idle-seconds N   (llama-server) asleep after N s without a request: /props says
                           is_sleeping, and the next request wakes it (in --wake-ms)
  --fail-sleep             sleep calls answer 500
  --fail-wake              wake calls answer 500

Unknown flags are ignored with a warning.

A request can override some of these in a \"fakellm\" object of its JSON body: chunks, interval_ms,
delay_ms, status, abort_after_chunks, and stall_after_chunks (stop sending, keep the connection).
";

/// Flags that always take a value.
const VALUE_FLAGS: &[&str] = &[
    "--port",
    "--host",
    "-m",
    "--model",
    "-a",
    "--alias",
    "-np",
    "--parallel",
    "-c",
    "--ctx-size",
    "--props-n-ctx",
    "--loading-ms",
    "--progress-ms",
    "--exit-after-ms",
    "--idle-close-ms",
    "--slots-lag-ms",
    "--exit-code",
    "--stderr-lines",
    "--chunks",
    "--chunk-interval-ms",
    "--response-delay-ms",
    "--abort-after-chunks",
    "--completion-status",
    "--events-file",
    "--report-model-mib",
    "--report-kv-mib",
    "--report-compute-mib",
    "--report-device",
    "--threads",
    "--embedding-dim",
    "--fail-oom-once",
    "--wake-ms",
    "--sleep-idle-seconds",
];

const BOOL_FLAGS: &[&str] = &[
    "--require-model",
    "--never-healthy",
    "--ignore-sigterm",
    "--fork-grandchild",
    "--setpgrp-grandchild",
    "--buffer-report",
    "--fail-oom",
    "--fail-port",
    "--cors",
    "-kvu",
    "--kv-unified",
    "--health-progress",
    "--enable-sleep-mode",
    "--enable-memory-saver",
    "--fail-sleep",
    "--fail-wake",
];

fn looks_like_value(tok: &str) -> bool {
    !tok.starts_with('-') || (tok.len() > 1 && tok.parse::<f64>().is_ok())
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse::<T>()
        .map_err(|_| format!("invalid value '{v}' for {flag}"))
}

/// Parses the arguments (program name excluded).
pub fn parse(args: &[String]) -> Result<Parsed, String> {
    let mut cfg = Config::default();
    let mut port: Option<u16> = None;
    let mut i = 0;
    while i < args.len() {
        let tok = args[i].as_str();
        i += 1;
        if tok == "-h" || tok == "--help" {
            return Ok(Parsed::Help);
        }
        // `--flag=value` form for long flags.
        let (flag, inline): (&str, Option<&str>) = match tok.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (tok, None),
        };

        if flag == "--slots" {
            // llama-server's --slots is a boolean; ours takes an optional count.
            let v = match inline {
                Some(v) => Some(v.to_string()),
                None if i < args.len() && args[i].parse::<usize>().is_ok() => {
                    i += 1;
                    Some(args[i - 1].clone())
                }
                None => None,
            };
            if let Some(v) = v {
                cfg.slots = num::<usize>("--slots", &v)?.max(1);
            }
            continue;
        }

        if BOOL_FLAGS.contains(&flag) {
            if inline.is_some() {
                cfg.warnings.push(format!(
                    "warning: flag {flag} takes no value, ignoring value"
                ));
            }
            match flag {
                "--require-model" => cfg.require_model = true,
                "--never-healthy" => cfg.never_healthy = true,
                "--ignore-sigterm" => cfg.ignore_sigterm = true,
                "--fork-grandchild" => cfg.fork_grandchild = true,
                "--setpgrp-grandchild" => cfg.setpgrp_grandchild = true,
                "--buffer-report" => cfg.buffer_report = true,
                "--fail-oom" => cfg.fail_oom = true,
                "--fail-port" => cfg.fail_port = true,
                "--cors" => cfg.cors = true,
                "-kvu" | "--kv-unified" => cfg.kv_unified = true,
                "--health-progress" => cfg.health_progress = true,
                "--enable-sleep-mode" => cfg.enable_sleep_mode = true,
                "--enable-memory-saver" => cfg.enable_memory_saver = true,
                "--fail-sleep" => cfg.fail_sleep = true,
                "--fail-wake" => cfg.fail_wake = true,
                _ => unreachable!(),
            }
            continue;
        }

        if VALUE_FLAGS.contains(&flag) {
            let v: String = match inline {
                Some(v) => v.to_string(),
                None => {
                    if i >= args.len() {
                        return Err(format!("missing value for {flag}"));
                    }
                    i += 1;
                    args[i - 1].clone()
                }
            };
            match flag {
                "--port" => port = Some(num(flag, &v)?),
                "--host" => cfg.host = v,
                "-m" | "--model" => cfg.model = Some(v),
                "-a" | "--alias" => cfg.alias = v,
                "-np" | "--parallel" => cfg.slots = num::<usize>(flag, &v)?.max(1),
                "-c" | "--ctx-size" => cfg.ctx_size = num(flag, &v)?,
                "--props-n-ctx" => cfg.props_n_ctx = Some(num(flag, &v)?),
                "--loading-ms" => cfg.loading_ms = num(flag, &v)?,
                "--progress-ms" => cfg.progress_ms = num(flag, &v)?,
                "--wake-ms" => cfg.wake_ms = num(flag, &v)?,
                "--sleep-idle-seconds" => {
                    let n: i64 = num(flag, &v)?;
                    cfg.sleep_idle_seconds = u64::try_from(n).ok().filter(|n| *n > 0);
                }
                "--exit-after-ms" => cfg.exit_after_ms = Some(num(flag, &v)?),
                "--idle-close-ms" => cfg.idle_close_ms = Some(num(flag, &v)?),
                "--slots-lag-ms" => cfg.slots_lag_ms = num(flag, &v)?,
                "--exit-code" => cfg.exit_code = num(flag, &v)?,
                "--stderr-lines" => cfg.stderr_lines = num(flag, &v)?,
                "--chunks" => cfg.chunks = num(flag, &v)?,
                "--chunk-interval-ms" => cfg.chunk_interval_ms = num(flag, &v)?,
                "--response-delay-ms" => cfg.response_delay_ms = num(flag, &v)?,
                "--abort-after-chunks" => cfg.abort_after_chunks = Some(num(flag, &v)?),
                "--completion-status" => {
                    let s: u16 = num(flag, &v)?;
                    if !(100..=999).contains(&s) {
                        return Err(format!("invalid HTTP status '{v}' for {flag}"));
                    }
                    cfg.completion_status = Some(s);
                }
                "--events-file" => cfg.events_file = Some(v),
                "--fail-oom-once" => cfg.fail_oom_once = Some(v),
                "--report-model-mib" => cfg.report_model_mib = num(flag, &v)?,
                "--report-kv-mib" => cfg.report_kv_mib = num(flag, &v)?,
                "--report-compute-mib" => cfg.report_compute_mib = num(flag, &v)?,
                "--report-device" => cfg.report_devices.extend(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                ),
                "--threads" => cfg.threads = num::<usize>(flag, &v)?.max(1),
                "--embedding-dim" => cfg.embedding_dim = num::<usize>(flag, &v)?.clamp(1, 65536),
                _ => unreachable!(),
            }
            continue;
        }

        // Unknown argument: ignore it, consuming its value if it has one.
        if tok.starts_with('-') && tok.len() > 1 {
            if inline.is_none() && i < args.len() && looks_like_value(&args[i]) {
                cfg.warnings.push(format!(
                    "warning: ignoring unknown argument {tok} {}",
                    args[i]
                ));
                i += 1;
            } else {
                cfg.warnings
                    .push(format!("warning: ignoring unknown argument {tok}"));
            }
        } else {
            cfg.warnings
                .push(format!("warning: ignoring stray argument '{tok}'"));
        }
    }
    cfg.port = port.ok_or_else(|| "--port is required".to_string())?;
    Ok(Parsed::Run(Box::new(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Config, String> {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&v)? {
            Parsed::Run(c) => Ok(*c),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults() {
        let c = p(&["--port", "8080"]).unwrap();
        assert_eq!(c.port, 8080);
        assert_eq!(c.host, "127.0.0.1");
        assert_eq!(c.alias, "fakellm");
        assert_eq!(c.slots, 1);
        assert_eq!(c.ctx_size, 4096);
        assert_eq!(c.chunks, 5);
        assert_eq!(c.chunk_interval_ms, 10);
        assert_eq!(c.exit_code, 1);
        assert_eq!(c.threads, 1);
        assert_eq!(c.embedding_dim, 8);
        assert_eq!(c.report_model_mib, 100.0);
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn port_required_and_equals_form() {
        assert!(p(&[]).is_err());
        assert!(p(&["--host", "0.0.0.0"]).is_err());
        assert_eq!(p(&["--port=1234"]).unwrap().port, 1234);
        assert!(p(&["--port", "x"]).is_err());
        assert!(p(&["--port"]).is_err());
        assert_eq!(p(&["--port=1", "--alias=foo"]).unwrap().alias, "foo");
    }

    #[test]
    fn llama_server_command_line() {
        let c = p(&[
            "-m",
            "model.gguf",
            "-c",
            "8192",
            "-ngl",
            "99",
            "--cache-type-k",
            "q8_0",
            "--mmproj",
            "x",
            "--jinja",
            "--port",
            "9000",
            "-np",
            "4",
            "--seed",
            "-1",
            "--flash-attn",
            "on",
            "--alias",
            "m1",
        ])
        .unwrap();
        assert_eq!(c.model.as_deref(), Some("model.gguf"));
        assert_eq!(c.ctx_size, 8192);
        assert_eq!(c.port, 9000);
        assert_eq!(c.slots, 4);
        assert_eq!(c.alias, "m1");
        // -ngl 99, --cache-type-k q8_0, --mmproj x, --jinja, --seed -1, --flash-attn on
        assert_eq!(c.warnings.len(), 6, "{:?}", c.warnings);
    }

    #[test]
    fn kv_unified_and_props_n_ctx_shape_what_props_reports() {
        let c = p(&["--port", "5", "-kvu", "--props-n-ctx", "3000"]).unwrap();
        assert!(c.kv_unified);
        assert_eq!(c.props_n_ctx, Some(3000));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let plain = p(&["--port", "5"]).unwrap();
        assert!(!plain.kv_unified);
        assert_eq!(plain.props_n_ctx, None);
    }

    #[test]
    fn unknown_flag_followed_by_flag_is_boolean() {
        let c = p(&["--no-webui", "--port", "5"]).unwrap();
        assert_eq!(c.port, 5);
        assert_eq!(c.warnings.len(), 1);
    }

    #[test]
    fn stray_positional_is_ignored() {
        let c = p(&["--port", "5", "stray"]).unwrap();
        assert_eq!(c.warnings.len(), 1);
    }

    #[test]
    fn slots_aliases() {
        assert_eq!(p(&["--port", "1", "--slots", "3"]).unwrap().slots, 3);
        assert_eq!(p(&["--port", "1", "--parallel", "2"]).unwrap().slots, 2);
        assert_eq!(p(&["--port", "1", "--slots=6"]).unwrap().slots, 6);
        // llama-server style boolean --slots
        let c = p(&["--slots", "--port", "1"]).unwrap();
        assert_eq!(c.slots, 1);
        assert_eq!(c.port, 1);
        assert_eq!(p(&["--port", "1", "-np", "0"]).unwrap().slots, 1);
    }

    #[test]
    fn all_flags() {
        let c = p(&[
            "--port",
            "1",
            "--host",
            "::1",
            "--require-model",
            "--loading-ms",
            "100",
            "--progress-ms",
            "20",
            "--never-healthy",
            "--exit-after-ms",
            "300",
            "--exit-code",
            "-3",
            "--stderr-lines",
            "7",
            "--chunks",
            "9",
            "--chunk-interval-ms",
            "0",
            "--response-delay-ms",
            "11",
            "--abort-after-chunks",
            "2",
            "--completion-status",
            "429",
            "--ignore-sigterm",
            "--fork-grandchild",
            "--setpgrp-grandchild",
            "--events-file",
            "/tmp/e",
            "--buffer-report",
            "--report-model-mib",
            "1.5",
            "--report-kv-mib",
            "2",
            "--report-compute-mib",
            "3",
            "--report-device",
            "CUDA0,CUDA1",
            "--threads",
            "4",
            "--embedding-dim",
            "16",
            "--health-progress",
        ])
        .unwrap();
        assert_eq!(c.host, "::1");
        assert!(c.health_progress);
        assert!(c.require_model && c.never_healthy && c.ignore_sigterm);
        assert!(c.fork_grandchild && c.setpgrp_grandchild && c.buffer_report);
        assert_eq!(c.loading_ms, 100);
        assert_eq!(c.progress_ms, 20);
        assert_eq!(c.exit_after_ms, Some(300));
        assert_eq!(c.exit_code, -3);
        assert_eq!(c.stderr_lines, 7);
        assert_eq!(c.chunks, 9);
        assert_eq!(c.chunk_interval_ms, 0);
        assert_eq!(c.response_delay_ms, 11);
        assert_eq!(c.abort_after_chunks, Some(2));
        assert_eq!(c.completion_status, Some(429));
        assert_eq!(c.events_file.as_deref(), Some("/tmp/e"));
        assert_eq!(c.report_model_mib, 1.5);
        assert_eq!(c.report_kv_mib, 2.0);
        assert_eq!(c.report_compute_mib, 3.0);
        assert_eq!(c.report_devices, vec!["CUDA0", "CUDA1"]);
        assert_eq!(c.threads, 4);
        assert_eq!(c.embedding_dim, 16);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn bad_status_rejected() {
        assert!(p(&["--port", "1", "--completion-status", "42"]).is_err());
    }

    #[test]
    fn help() {
        let v = vec!["--help".to_string()];
        assert_eq!(parse(&v).unwrap(), Parsed::Help);
    }
}
