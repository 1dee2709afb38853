//! Command-line parsing, with llama-swap's single-dash spellings (`-config`, `-listen`, ...).

use std::net::SocketAddr;
use std::path::PathBuf;

use corral::config::Sources;

pub const USAGE: &str =
    "usage: corral [--config FILE] [--config-dir DIR] [--listen ADDR] [--watch-config]
              [--tls-cert-file FILE --tls-key-file FILE]
       corral --validate --config FILE [--config-dir DIR]   (load the config, print a summary)
       corral check --config FILE [--config-dir DIR] [--show-secrets]
       corral pull --config FILE [--config-dir DIR] [MODEL...]   (fetch weights, start nothing)
       corral estimate FILE.gguf [-c N] [-np N] [-ngl N] [-ctk T] [-ctv T]
       corral fake-engine --port N [...]   (a small llama-server imitation for demos and tests)
       corral --version

With no --config, corral serves an embedded demo config (two fake models).
--listen defaults to :8080 (all interfaces), like llama-swap; :8443 when serving HTTPS.";

/// The PEM files of the listener's certificate chain and private key (`--tls-cert-file`,
/// `--tls-key-file`).
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct ServeOptions {
    pub sources: Sources,
    pub listen: SocketAddr,
    pub watch_config: bool,
    /// Serve HTTPS with these files.
    pub tls: Option<TlsFiles>,
    /// `corral check` only: print keys and tokens in commands instead of `***`.
    pub show_secrets: bool,
}

/// `corral pull`: the config, and the models named (ids or aliases; none means every model
/// with a source).
pub struct PullOptions {
    pub sources: Sources,
    pub models: Vec<String>,
}

pub enum Command {
    Serve(ServeOptions),
    Check(ServeOptions),
    /// `-validate`: load the config, say whether it is valid, start nothing (llama-swap's flag).
    Validate(Sources),
    Pull(PullOptions),
    FakeEngine(Vec<String>),
    Estimate(Vec<String>),
    Version,
    Help,
}

/// Which command the flags belong to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Serve,
    Check,
    Pull,
}

pub fn parse(args: &[String]) -> Result<Command, String> {
    let (mode, rest) = match args.first().map(String::as_str) {
        Some("fake-engine") => return Ok(Command::FakeEngine(args[1..].to_vec())),
        Some("estimate") => return Ok(Command::Estimate(args[1..].to_vec())),
        Some("check") => (Mode::Check, &args[1..]),
        Some("pull") => (Mode::Pull, &args[1..]),
        _ => (Mode::Serve, args),
    };
    let mut flags = Flags::default();
    let mut it = rest.iter().cloned();
    while let Some(arg) = it.next() {
        if let Some(done) = flags.take(mode, arg, &mut it)? {
            return Ok(done);
        }
    }
    flags.finish(mode)
}

/// The flags seen so far.
#[derive(Default)]
struct Flags {
    sources: Sources,
    listen: Option<SocketAddr>,
    watch_config: bool,
    show_secrets: bool,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    validate: bool,
    /// `corral pull`'s model names.
    models: Vec<String>,
}

impl Flags {
    /// Takes one argument (and its value, from `rest` unless given as `--flag=value`); a
    /// command that ends the parse (`--version`, `--help`) comes back at once.
    fn take(
        &mut self,
        mode: Mode,
        arg: String,
        rest: &mut impl Iterator<Item = String>,
    ) -> Result<Option<Command>, String> {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if mode == Mode::Pull && !flag.starts_with('-') {
            self.models.push(arg);
            return Ok(None);
        }
        let flag = flag.trim_start_matches('-');
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| rest.next())
                .ok_or_else(|| format!("--{name} needs a value"))
        };
        let serving = mode != Mode::Pull;
        match flag {
            "config" => self.sources.file = Some(PathBuf::from(value("config")?)),
            "config-dir" => self.sources.dir = Some(PathBuf::from(value("config-dir")?)),
            "listen" if serving => self.listen = Some(parse_listen(&value("listen")?)?),
            "watch-config" if serving => self.watch_config = true,
            "tls-cert-file" if serving => self.tls_cert = Some(value("tls-cert-file")?.into()),
            "tls-key-file" if serving => self.tls_key = Some(value("tls-key-file")?.into()),
            "validate" if mode == Mode::Serve => self.validate = true,
            "show-secrets" if mode == Mode::Check => self.show_secrets = true,
            "version" => return Ok(Some(Command::Version)),
            "help" | "h" => return Ok(Some(Command::Help)),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
        Ok(None)
    }

    /// The command the flags make, once all are read.
    fn finish(self, mode: Mode) -> Result<Command, String> {
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            (Some(_), None) => return Err("--tls-cert-file needs --tls-key-file too".into()),
            (None, Some(_)) => return Err("--tls-key-file needs --tls-cert-file too".into()),
        };
        // llama-swap's rule: HTTPS without an address listens on :8443
        let default_listen = if tls.is_some() { ":8443" } else { ":8080" };
        let opts = ServeOptions {
            sources: self.sources,
            listen: self
                .listen
                .map_or_else(|| parse_listen(default_listen), Ok)?,
            watch_config: self.watch_config,
            tls,
            show_secrets: self.show_secrets,
        };
        Ok(match mode {
            Mode::Serve if self.validate => Command::Validate(opts.sources),
            Mode::Serve => Command::Serve(opts),
            Mode::Check => Command::Check(opts),
            Mode::Pull => Command::Pull(PullOptions {
                sources: opts.sources,
                models: self.models,
            }),
        })
    }
}

/// `:8080` means every interface, as in Go; `host:port` and `[v6]:port` as usual.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    if let Ok(addr) = full.parse() {
        return Ok(addr);
    }
    use std::net::ToSocketAddrs;
    full.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("--listen {s:?} is not an address like :8080 or 127.0.0.1:8080"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_args(args: &[&str]) -> Result<Command, String> {
        parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    fn serve(args: &[&str]) -> ServeOptions {
        match parse_args(args) {
            Ok(Command::Serve(opts)) => opts,
            _ => panic!("{args:?} is not a serve command"),
        }
    }

    #[test]
    fn tls_flags_in_either_spelling() {
        let opts = serve(&["-tls-cert-file", "c.pem", "--tls-key-file=k.pem"]);
        let tls = opts.tls.expect("TLS on");
        assert_eq!(tls.cert, PathBuf::from("c.pem"));
        assert_eq!(tls.key, PathBuf::from("k.pem"));
    }

    #[test]
    fn https_listens_on_8443_unless_told() {
        assert_eq!(serve(&[]).listen.port(), 8080);
        let tls = ["--tls-cert-file", "c.pem", "--tls-key-file", "k.pem"];
        assert_eq!(serve(&tls).listen.port(), 8443);
        let told = serve(&[&tls[..], &["-listen", "127.0.0.1:9000"]].concat());
        assert_eq!(told.listen.to_string(), "127.0.0.1:9000");
    }

    #[test]
    fn one_tls_flag_without_the_other_names_the_other() {
        let err = parse_args(&["-tls-cert-file", "c.pem"]).err().unwrap();
        assert_eq!(err, "--tls-cert-file needs --tls-key-file too");
        let err = parse_args(&["-tls-key-file", "k.pem"]).err().unwrap();
        assert_eq!(err, "--tls-key-file needs --tls-cert-file too");
    }

    #[test]
    fn validate_takes_the_config_sources() {
        let Ok(Command::Validate(sources)) =
            parse_args(&["-validate", "-config", "a.yaml", "-config-dir", "d"])
        else {
            panic!("not a validate command");
        };
        assert_eq!(sources.file, Some(PathBuf::from("a.yaml")));
        assert_eq!(sources.dir, Some(PathBuf::from("d")));
        assert!(parse_args(&["pull", "-validate"]).is_err());
    }
}
