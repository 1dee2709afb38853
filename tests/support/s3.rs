//! moto's S3 server for the source tests (tests/python/s3_server.py), or `None` after a loud skip
//! line when the Python environment lacks moto.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub struct S3 {
    pub url: String,
    pub key: String,
    pub secret: String,
    child: Child,
}

impl S3 {
    /// A server holding `data` at `s3://bucket/key`.
    pub fn start(bucket: &str, key: &str, data: &[u8]) -> Option<S3> {
        let python = match std::env::var("CORRAL_PYTHON") {
            Ok(p) if !p.is_empty() => p,
            _ if std::env::var_os("CI").is_some() => panic!("CORRAL_PYTHON is not set"),
            _ => return skip("CORRAL_PYTHON is not set"),
        };
        let has_moto = Command::new(&python)
            .args(["-c", "import moto.server, boto3"])
            .output();
        if !has_moto.is_ok_and(|o| o.status.success()) {
            return skip("moto[server] is not installed in CORRAL_PYTHON's environment");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("object");
        std::fs::write(&file, data).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/s3_server.py");
        let mut child = Command::new(python)
            .args([script, bucket, key])
            .arg(&file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("s3_server.py said {line:?}: {e}"));
        let text = |k: &str| v[k].as_str().unwrap().to_string();
        Some(S3 {
            url: text("url"),
            key: text("key"),
            secret: text("secret"),
            child,
        })
    }
}

fn skip(why: &str) -> Option<S3> {
    eprintln!("\n*** SKIPPED: {why}; run scripts/setup-python.sh ***\n");
    None
}

impl Drop for S3 {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
