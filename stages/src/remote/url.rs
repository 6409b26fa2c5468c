//! Remote dataset URLs and the object store each one names.
//!
//! ```
//! use ferrofeed_stages::remote::{is_remote, RemoteUrl, Scheme};
//! assert!(is_remote("s3://bucket/train"));
//! assert!(!is_remote("data/train"));
//! let u = RemoteUrl::parse("s3://bucket/train/").unwrap();
//! assert_eq!((u.scheme, u.bucket.as_str(), u.prefix.as_str()), (Scheme::S3, "bucket", "train"));
//! assert_eq!(u.object_url("train/a.jpg"), "s3://bucket/train/a.jpg");
//! ```
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;

use super::RemoteError;

/// The kind of store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `s3://bucket/prefix` (AWS S3 or any S3-compatible server).
    S3,
    /// `gs://bucket/prefix`.
    Gcs,
    /// `az://container/prefix`.
    Azure,
    /// `http(s)://host/prefix`.
    Http,
}

/// Whether `path` is a URL ferrofeed reads remotely.
pub fn is_remote(path: &str) -> bool {
    ["s3://", "gs://", "az://", "http://", "https://"]
        .iter()
        .any(|p| path.starts_with(p))
}

/// A parsed remote dataset location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// The store kind.
    pub scheme: Scheme,
    /// Bucket or container; for HTTP, `scheme://host[:port]`.
    pub bucket: String,
    /// Object prefix inside the bucket, without leading or trailing `/`.
    pub prefix: String,
    /// The URL as given.
    pub text: String,
}

impl RemoteUrl {
    /// Parses `s3://`, `gs://`, `az://` and `http(s)://` URLs.
    pub fn parse(text: &str) -> Result<RemoteUrl, RemoteError> {
        let bad = |why: &str| RemoteError::Url {
            url: text.to_string(),
            message: why.to_string(),
        };
        let (scheme, rest) = if let Some(r) = text.strip_prefix("s3://") {
            (Scheme::S3, r)
        } else if let Some(r) = text.strip_prefix("gs://") {
            (Scheme::Gcs, r)
        } else if let Some(r) = text.strip_prefix("az://") {
            (Scheme::Azure, r)
        } else if text.starts_with("http://") || text.starts_with("https://") {
            let split = text.find("://").map_or(0, |i| i + 3);
            let (head, tail) = text[split..]
                .split_once('/')
                .unwrap_or((&text[split..], ""));
            if head.is_empty() {
                return Err(bad("no host"));
            }
            return Ok(RemoteUrl {
                scheme: Scheme::Http,
                bucket: format!("{}{head}", &text[..split]),
                prefix: tail.trim_matches('/').to_string(),
                text: text.to_string(),
            });
        } else {
            return Err(bad("expected s3://, gs://, az://, http:// or https://"));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        Ok(RemoteUrl {
            scheme,
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            text: text.to_string(),
        })
    }

    /// The URL of the object at `key` (a path inside the bucket).
    pub fn object_url(&self, key: &str) -> String {
        match self.scheme {
            Scheme::S3 => format!("s3://{}/{key}", self.bucket),
            Scheme::Gcs => format!("gs://{}/{key}", self.bucket),
            Scheme::Azure => format!("az://{}/{key}", self.bucket),
            Scheme::Http => format!("{}/{key}", self.bucket),
        }
    }

    /// The store for this URL, configured from the environment (`AWS_*`,
    /// `GOOGLE_*`, `AZURE_*`), with `connect_timeout`. Retries and the
    /// stall timeout are ferrofeed's own (counted in the report), so the
    /// store retries nothing and only bounds a whole request by an hour.
    pub fn store(&self, connect_timeout: Duration) -> Result<Arc<dyn ObjectStore>, RemoteError> {
        let timeout = Duration::from_secs(3600);
        use object_store::{ClientConfigKey as C, RetryConfig};
        let no_retry = RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        };
        let t = format!("{}ms", timeout.as_millis());
        let ct = format!("{}ms", connect_timeout.as_millis());
        let err = |e: object_store::Error| RemoteError::Url {
            url: self.text.clone(),
            message: e.to_string(),
        };
        Ok(match self.scheme {
            Scheme::S3 => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as K};
                let mut b = AmazonS3Builder::from_env()
                    .with_bucket_name(&self.bucket)
                    .with_retry(no_retry)
                    .with_config(K::Client(C::Timeout), t)
                    .with_config(K::Client(C::ConnectTimeout), ct);
                if std::env::var_os("AWS_REGION").is_none()
                    && std::env::var_os("AWS_DEFAULT_REGION").is_none()
                {
                    b = b.with_region("us-east-1");
                } else if let Some(r) = std::env::var("AWS_REGION")
                    .ok()
                    .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
                {
                    b = b.with_region(r);
                }
                Arc::new(b.build().map_err(err)?)
            }
            Scheme::Gcs => {
                use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey as K};
                Arc::new(
                    GoogleCloudStorageBuilder::from_env()
                        .with_bucket_name(&self.bucket)
                        .with_retry(no_retry)
                        .with_config(K::Client(C::Timeout), t)
                        .with_config(K::Client(C::ConnectTimeout), ct)
                        .build()
                        .map_err(err)?,
                )
            }
            Scheme::Azure => {
                use object_store::azure::{AzureConfigKey as K, MicrosoftAzureBuilder};
                Arc::new(
                    MicrosoftAzureBuilder::from_env()
                        .with_container_name(&self.bucket)
                        .with_retry(no_retry)
                        .with_config(K::Client(C::Timeout), t)
                        .with_config(K::Client(C::ConnectTimeout), ct)
                        .build()
                        .map_err(err)?,
                )
            }
            Scheme::Http => {
                use object_store::http::HttpBuilder;
                let client = object_store::ClientOptions::new()
                    .with_allow_http(true)
                    .with_timeout(timeout)
                    .with_connect_timeout(connect_timeout);
                Arc::new(
                    HttpBuilder::new()
                        .with_url(&self.bucket)
                        .with_retry(no_retry)
                        .with_client_options(client)
                        .build()
                        .map_err(err)?,
                )
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_parses_and_bad_urls_are_refused() {
        let g = RemoteUrl::parse("gs://b/x/y").unwrap();
        assert_eq!((g.scheme, g.prefix.as_str()), (Scheme::Gcs, "x/y"));
        let a = RemoteUrl::parse("az://c").unwrap();
        assert_eq!(
            (a.scheme, a.bucket.as_str(), a.prefix.as_str()),
            (Scheme::Azure, "c", "")
        );
        let h = RemoteUrl::parse("http://127.0.0.1:9000/bucket/shards/").unwrap();
        assert_eq!(h.bucket, "http://127.0.0.1:9000");
        assert_eq!(h.prefix, "bucket/shards");
        assert_eq!(
            h.object_url("bucket/shards/a.tar"),
            "http://127.0.0.1:9000/bucket/shards/a.tar"
        );
        for bad in ["s3://", "s3:///x", "ftp://x/y", "http:///x"] {
            let e = RemoteUrl::parse(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn builders_accept_each_scheme_without_network() {
        // Building a store makes no request; credentials are looked up
        // lazily. GCS and Azure need an account or credentials to build.
        std::env::set_var("AZURE_STORAGE_ACCOUNT_NAME", "devaccount");
        std::env::set_var("AZURE_STORAGE_ACCOUNT_KEY", "a2V5");
        std::env::set_var(
            "GOOGLE_SERVICE_ACCOUNT_KEY",
            r#"{"private_key": "", "client_email": "x@y"}"#,
        );
        let d = Duration::from_secs(1);
        for url in ["s3://bucket/p", "az://container/p", "http://127.0.0.1:1/b"] {
            RemoteUrl::parse(url)
                .unwrap()
                .store(d)
                .unwrap_or_else(|e| panic!("{url}: {e}"));
        }
        // A malformed GCS key is refused with the URL named, not a panic.
        if let Err(e) = RemoteUrl::parse("gs://bucket/p").unwrap().store(d) {
            assert!(e.to_string().contains("gs://bucket/p"), "{e}");
        }
    }
}
