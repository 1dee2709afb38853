//! Digests computed while a file streams in, so a download is checked without reading it twice.

use md5::Digest as _;
use sha2::Digest as _;

/// What a finished file must match besides its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Nothing known beyond the size.
    Size,
    /// The hex SHA-256 of the content (a Hub LFS file, an Ollama blob, `sha256:` in the config).
    Sha256(String),
    /// Git's blob id (SHA-1 of `blob <size>\0` and the content): the Hub's small, non-LFS files.
    GitBlob(String),
    /// The hex MD5 of the content: an S3 ETag of a single-part upload.
    Md5(String),
}

impl Verify {
    /// Whether the content is checked against a digest, which a file mixed from two versions
    /// fails (a size alone does not).
    pub(crate) fn is_digest(&self) -> bool {
        !matches!(self, Verify::Size)
    }
}

pub(crate) enum Hasher {
    None,
    Sha256(sha2::Sha256),
    Sha1(sha1::Sha1),
    Md5(md5::Md5),
}

impl Hasher {
    /// A fresh digest; a git blob's header needs the size up front.
    pub(crate) fn new(verify: &Verify, size: Option<u64>) -> Hasher {
        match verify {
            Verify::Size => Hasher::None,
            Verify::Sha256(_) => Hasher::Sha256(sha2::Sha256::new()),
            Verify::GitBlob(_) => {
                let mut h = sha1::Sha1::new();
                sha1::Digest::update(&mut h, format!("blob {}\0", size.unwrap_or(0)).as_bytes());
                Hasher::Sha1(h)
            }
            Verify::Md5(_) => Hasher::Md5(md5::Md5::new()),
        }
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::None => {}
            Hasher::Sha256(h) => sha2::Digest::update(h, data),
            Hasher::Sha1(h) => sha1::Digest::update(h, data),
            Hasher::Md5(h) => md5::Digest::update(h, data),
        }
    }

    /// `Err((expected, got))` when the content does not match.
    pub(crate) fn check(self, verify: &Verify) -> Result<(), (String, String)> {
        let got = match self {
            Hasher::None => return Ok(()),
            Hasher::Sha256(h) => hex(&sha2::Digest::finalize(h)),
            Hasher::Sha1(h) => hex(&sha1::Digest::finalize(h)),
            Hasher::Md5(h) => hex(&md5::Digest::finalize(h)),
        };
        let expected = match verify {
            Verify::Size => return Ok(()),
            Verify::Sha256(e) | Verify::GitBlob(e) | Verify::Md5(e) => e.to_ascii_lowercase(),
        };
        if got == expected {
            Ok(())
        } else {
            Err((expected, got))
        }
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hex SHA-256 of a byte string (cache directory names for URLs).
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex(&sha2::Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(verify: &Verify, data: &[u8]) -> Result<(), (String, String)> {
        let mut h = Hasher::new(verify, Some(data.len() as u64));
        h.update(data);
        h.check(verify)
    }

    #[test]
    fn git_blob_id_matches_git() {
        // `printf hello | git hash-object --stdin`
        let id = "b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0";
        assert!(digest(&Verify::GitBlob(id.into()), b"hello").is_ok());
        assert!(digest(&Verify::GitBlob(id.into()), b"hellO").is_err());
    }

    #[test]
    fn sha256_and_md5() {
        let sha = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
        assert!(digest(&Verify::Sha256(sha.to_uppercase()), b"hello").is_ok());
        let md5 = "5d41402abc4b2a76b9719d911017c592";
        assert!(digest(&Verify::Md5(md5.into()), b"hello").is_ok());
        let (expected, got) = digest(&Verify::Md5(md5.into()), b"x").unwrap_err();
        assert_eq!(expected, md5);
        assert_ne!(got, md5);
    }
}
