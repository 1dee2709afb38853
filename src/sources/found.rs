//! What the caches hold complete for a source, as each kind of source finds it (`hf`, `ollama`,
//! `remote`): where it lies, and the files in it to check against their digest before their
//! first use.

use std::path::PathBuf;

use super::verify::Verify;
use super::Fetched;

/// What the caches hold complete for a source: where it lies, and the files in it whose digest is
/// known, to check before their first use.
pub(crate) struct Found {
    pub fetched: Fetched,
    pub checks: Vec<Check>,
}

/// A file to check against its digest.
pub(crate) struct Check {
    /// Its name within the source, for errors.
    pub file: String,
    pub path: PathBuf,
    pub verify: Verify,
}

impl Found {
    /// A file of a source whose content cannot be checked (a path, a URL without `sha256:`).
    pub(crate) fn unchecked(fetched: Fetched) -> Found {
        Found {
            fetched,
            checks: Vec::new(),
        }
    }
}
