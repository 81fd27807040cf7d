//! Copy definitions on disk: one JSON file per copy in the data directory's `copies/`, mode
//! 0600 (the target URL may carry a password), the directory 0700.

use std::path::{Path, PathBuf};

use crate::{CopyError, CopySpec};

/// The definitions of one cluster's copies.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The store in `dir` (created on the first save).
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    /// Saves `spec`, replacing an earlier definition of the same name.
    pub fn save(&self, spec: &CopySpec) -> Result<(), CopyError> {
        use std::os::unix::fs::DirBuilderExt;
        let fail = |action, path: &Path, e: &dyn std::fmt::Display| CopyError::File {
            action,
            path: path.to_path_buf(),
            detail: e.to_string(),
        };
        if !self.dir.exists() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .recursive(true)
                .create(&self.dir)
                .map_err(|e| fail("creating", &self.dir, &e))?;
        }
        let path = self.file(&spec.name);
        let text = serde_json::to_string_pretty(spec).map_err(|e| fail("encoding", &path, &e))?;
        herd_pg::write_private(&path, &text).map_err(|e| fail("writing", &path, &e))
    }

    /// The definition named `name`, if there is one.
    pub fn load(&self, name: &str) -> Result<Option<CopySpec>, CopyError> {
        crate::spec::validate_name(name)?;
        let path = self.file(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| CopyError::File {
                    action: "reading (damaged JSON)",
                    path,
                    detail: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CopyError::File {
                action: "reading",
                path,
                detail: e.to_string(),
            }),
        }
    }

    /// Every definition, by name; damaged files are reported, not skipped silently.
    pub fn list(&self) -> Result<Vec<CopySpec>, CopyError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(CopyError::File {
                    action: "listing",
                    path: self.dir.clone(),
                    detail: e.to_string(),
                })
            }
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".json"))
                    .map(str::to_string)
            })
            .collect();
        names.sort();
        let mut specs = Vec::new();
        for name in names {
            if let Some(spec) = self.load(&name)? {
                specs.push(spec);
            }
        }
        Ok(specs)
    }

    /// Forgets the definition named `name`.
    pub fn remove(&self, name: &str) -> Result<(), CopyError> {
        let path = self.file(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CopyError::File {
                action: "removing",
                path,
                detail: e.to_string(),
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use crate::TableSpec;

    #[test]
    fn saved_private_listed_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("copies"));
        assert!(store.list().expect("empty").is_empty());
        let spec = CopySpec {
            name: "a".into(),
            group: 1,
            database: "postgres".into(),
            tables: vec![TableSpec::new("t").expect("valid")],
            schemas: vec![],
            target: "postgresql://u:secret@h/db".into(),
            publish: None,
        };
        store.save(&spec).expect("save");
        let file = dir.path().join("copies/a.json");
        let mode = std::fs::metadata(&file).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(store.load("a").expect("load"), Some(spec.clone()));
        assert_eq!(store.list().expect("list"), vec![spec]);
        std::fs::write(dir.path().join("copies/b.json"), "{").expect("write");
        assert!(store.list().is_err(), "a damaged file is reported");
        store.remove("a").expect("remove");
        assert_eq!(store.load("a").expect("load"), None);
    }
}
