//! `[backup.s3]`: a pgBackRest repository in an S3-compatible object store instead of a
//! directory (`repo1-type=s3`). The access key stays out of herd.toml: it is read from
//! `credentials_file` when pgbackrest.conf is written (that file is 0600).

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// `[backup.s3]`: where the repository lives in an object store. `backup.repository` is then
/// the path inside the bucket (default `/herd`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct S3Config {
    /// The bucket (`repo1-s3-bucket`).
    pub bucket: String,
    /// The endpoint's host name, e.g. `s3.eu-west-1.amazonaws.com` or a MinIO host
    /// (`repo1-s3-endpoint`).
    pub endpoint: String,
    /// The region (`repo1-s3-region`).
    pub region: String,
    /// `host` (bucket in the host name, AWS's default) or `path` (bucket in the path, usual
    /// for MinIO and other self-hosted stores) (`repo1-s3-uri-style`).
    pub uri_style: String,
    /// A file holding the access key id on its first line and the secret key on its second;
    /// relative paths are from herd.toml's directory. Read when pgbackrest.conf is written.
    pub credentials_file: String,
    /// Verify the endpoint's TLS certificate (`repo1-storage-verify-tls`); turn off only for a
    /// test store with a self-signed certificate.
    pub verify_tls: bool,
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            bucket: String::new(),
            endpoint: String::new(),
            region: String::new(),
            uri_style: "host".into(),
            credentials_file: String::new(),
            verify_tls: true,
        }
    }
}

impl S3Config {
    /// Checks what pgBackRest needs and what may be written into pgbackrest.conf (one
    /// `key=value` a line).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("backup.s3.bucket", &self.bucket),
            ("backup.s3.endpoint", &self.endpoint),
            ("backup.s3.region", &self.region),
            ("backup.s3.credentials_file", &self.credentials_file),
        ] {
            if value.trim().is_empty() {
                return Err(ConfigError::invalid(
                    key,
                    value,
                    "a value (the bucket, endpoint, region and credentials file are all required)",
                ));
            }
            if value.contains(['\n', '=', ' ']) {
                return Err(ConfigError::invalid(
                    key,
                    value,
                    "a value without spaces, newlines or '='",
                ));
            }
        }
        if self.endpoint.contains("://") {
            return Err(ConfigError::invalid(
                "backup.s3.endpoint",
                &self.endpoint,
                "a host name (optionally :port) without a scheme: pgBackRest always uses https",
            ));
        }
        if self.uri_style != "host" && self.uri_style != "path" {
            return Err(ConfigError::invalid(
                "backup.s3.uri_style",
                &self.uri_style,
                "host or path",
            ));
        }
        Ok(())
    }
}

/// The access key pair from a credentials file's text: the key id on the first non-empty line,
/// the secret on the second.
pub fn parse_credentials(text: &str) -> Option<(String, String)> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let key = lines.next()?;
    let secret = lines.next()?;
    let fits = |s: &str| !s.contains(['=', ' ']);
    (fits(key) && fits(secret) && lines.next().is_none())
        .then(|| (key.to_string(), secret.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> S3Config {
        S3Config {
            bucket: "herd-backups".into(),
            endpoint: "s3.eu-west-1.amazonaws.com".into(),
            region: "eu-west-1".into(),
            credentials_file: "/etc/herd/s3.key".into(),
            ..S3Config::default()
        }
    }

    /// A change to a good configuration, and the key its refusal names.
    type Case = (fn(&mut S3Config), &'static str);

    #[test]
    fn each_setting_is_checked() {
        assert!(good().validate().is_ok());
        let cases: Vec<Case> = vec![
            (|c| c.bucket.clear(), "backup.s3.bucket"),
            (|c| c.endpoint.clear(), "backup.s3.endpoint"),
            (|c| c.region.clear(), "backup.s3.region"),
            (|c| c.credentials_file.clear(), "backup.s3.credentials_file"),
            (|c| c.bucket = "a=b".into(), "backup.s3.bucket"),
            (|c| c.region = "eu\nx".into(), "backup.s3.region"),
            (
                |c| c.endpoint = "https://s3.example".into(),
                "backup.s3.endpoint",
            ),
            (|c| c.uri_style = "virtual".into(), "backup.s3.uri_style"),
        ];
        for (change, key) in cases {
            let mut c = good();
            change(&mut c);
            let err = c.validate().expect_err(key).to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
        let mut path = good();
        path.uri_style = "path".into();
        assert!(path.validate().is_ok());
    }

    #[test]
    fn credentials_are_two_lines() {
        assert_eq!(
            parse_credentials("AKIA123\nsecret/xyz+1\n"),
            Some(("AKIA123".into(), "secret/xyz+1".into()))
        );
        assert_eq!(
            parse_credentials("\n  AKIA123  \n\nsecret\n"),
            Some(("AKIA123".into(), "secret".into()))
        );
        for bad in ["", "AKIA123\n", "a\nb\nc\n", "a=b\nc\n", "a\nb c\n"] {
            assert_eq!(parse_credentials(bad), None, "{bad:?}");
        }
    }
}
