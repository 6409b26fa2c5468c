//! Settings from keywords, for front ends that take typed values by name
//! (the Python loaders): each keyword goes straight into the field of the
//! same name of [`CommonSettings`], [`RemoteSettings`] or the domain's
//! options, with the same defaults and checks as the command's flags. No
//! command line is made or parsed.
//!
//! ```
//! use ferrofeed_jobs::keywords::{from_keywords, DomainSettings, KeywordError};
//! let kw = serde_json::json!({"batch_size": 8, "transform": "eval", "workers": "auto"});
//! let s = from_keywords("vision", None, kw.as_object().unwrap()).unwrap();
//! let DomainSettings::Vision(v) = s else { unreachable!() };
//! assert_eq!(v.common.batch_size, 8);
//! let bad = serde_json::json!({"batch_sise": 8});
//! let e = from_keywords("vision", None, bad.as_object().unwrap()).unwrap_err();
//! assert!(matches!(e, KeywordError::Unknown { .. }));
//! ```
use std::path::PathBuf;

use serde::de::{self, Deserialize, DeserializeOwned, Deserializer, Visitor};
use serde_json::{Map, Value};

use crate::audio::{AudioOptions, AudioSettings};
use crate::text::{TextOptions, TextSettings};
use crate::vision::{VisionOptions, VisionSettings};
use crate::{CommonSettings, Job, JobError, RemoteSettings};

/// The domains a job can be built for.
pub const DOMAINS: [&str; 3] = ["vision", "text", "audio"];

/// One domain's settings.
#[derive(Debug, Clone, PartialEq)]
pub enum DomainSettings {
    /// `ferrofeed vision`.
    Vision(VisionSettings),
    /// `ferrofeed text`.
    Text(TextSettings),
    /// `ferrofeed audio`.
    Audio(AudioSettings),
}

impl DomainSettings {
    /// The settings every domain shares.
    pub fn common(&self) -> &CommonSettings {
        match self {
            DomainSettings::Vision(s) => &s.common,
            DomainSettings::Text(s) => &s.common,
            DomainSettings::Audio(s) => &s.common,
        }
    }

    /// The settings every domain shares, to change.
    pub fn common_mut(&mut self) -> &mut CommonSettings {
        match self {
            DomainSettings::Vision(s) => &mut s.common,
            DomainSettings::Text(s) => &mut s.common,
            DomainSettings::Audio(s) => &mut s.common,
        }
    }

    /// Sets where batch buffers live, for the domains that collate into
    /// pooled buffers.
    pub fn set_pin(&mut self, pin: crate::Pin) {
        match self {
            DomainSettings::Vision(s) => s.vision.pin = pin,
            DomainSettings::Text(s) => s.text.pin = pin,
            DomainSettings::Audio(s) => s.audio.pin = pin,
        }
    }

    /// Builds the domain's job.
    pub fn build(self) -> Result<Job, JobError> {
        match self {
            DomainSettings::Vision(s) => crate::vision::build(s),
            DomainSettings::Text(s) => crate::text::build(s),
            DomainSettings::Audio(s) => crate::audio::build(s),
        }
    }
}

/// Why keywords made no settings.
#[derive(Debug, thiserror::Error)]
pub enum KeywordError {
    /// No such domain.
    #[error("unknown domain {0:?}: expected vision, text or audio")]
    Domain(String),
    /// A keyword that is no setting of the domain.
    #[error("{domain}() got an unexpected keyword argument '{key}'")]
    Unknown {
        /// The domain.
        domain: String,
        /// The keyword.
        key: String,
    },
    /// A value of the wrong type (text for a number, a list for a flag).
    #[error("{key}: {message}")]
    Type {
        /// The keyword.
        key: String,
        /// What was expected and what was given.
        message: String,
    },
    /// A value of the right type that the setting refuses.
    #[error("{key}: {message}")]
    Value {
        /// The keyword.
        key: String,
        /// Why.
        message: String,
    },
}

/// The groups of fields a domain's keywords go to, by name.
fn groups(domain: &str) -> Option<[&'static [&'static str]; 3]> {
    let own = match domain {
        "vision" => field_names::<VisionOptions>(),
        "text" => field_names::<TextOptions>(),
        "audio" => field_names::<AudioOptions>(),
        _ => return None,
    };
    Some([
        field_names::<CommonSettings>(),
        field_names::<RemoteSettings>(),
        own,
    ])
}

/// Every keyword `domain` takes and whether it takes a value (`false`: a
/// switch, `True`/`False`); `None` for an unknown domain.
///
/// ```
/// let k = ferrofeed_jobs::keywords::keywords("vision").unwrap();
/// assert!(k.contains(&("batch_size", true)) && k.contains(&("autotune", false)));
/// ```
pub fn keywords(domain: &str) -> Option<Vec<(&'static str, bool)>> {
    let [common, remote, own] = groups(domain)?;
    let takes_value = |group: usize, name: &str| {
        let mut one = Map::new();
        one.insert(name.to_string(), Value::Bool(true));
        let v = Value::Object(one);
        let is_switch = match group {
            0 => CommonSettings::deserialize(v).is_ok(),
            1 => RemoteSettings::deserialize(v).is_ok(),
            _ => match domain {
                "vision" => VisionOptions::deserialize(v).is_ok(),
                "text" => TextOptions::deserialize(v).is_ok(),
                _ => AudioOptions::deserialize(v).is_ok(),
            },
        };
        !is_switch
    };
    Some(
        [common, remote, own]
            .iter()
            .enumerate()
            .flat_map(|(g, names)| names.iter().map(move |n| (g, *n)))
            .map(|(g, n)| (n, takes_value(g, n)))
            .collect(),
    )
}

/// `domain`'s settings from `keywords` (values as JSON: numbers, text,
/// booleans, lists, null for "not given") and the dataset `path`.
pub fn from_keywords(
    domain: &str,
    path: Option<PathBuf>,
    keywords: &Map<String, Value>,
) -> Result<DomainSettings, KeywordError> {
    let Some(groups) = groups(domain) else {
        return Err(KeywordError::Domain(domain.to_string()));
    };
    let mut parts: [Map<String, Value>; 3] = Default::default();
    for (k, v) in keywords {
        let Some(g) = groups.iter().position(|names| names.contains(&k.as_str())) else {
            return Err(KeywordError::Unknown {
                domain: domain.to_string(),
                key: k.clone(),
            });
        };
        // null: the setting's default.
        if !v.is_null() {
            parts[g].insert(k.clone(), v.clone());
        }
    }
    let [common, remote, own] = parts;
    let mut common: CommonSettings = read(common)?;
    common.remote = read(remote)?;
    Ok(match domain {
        "vision" => DomainSettings::Vision(VisionSettings {
            path,
            vision: read(own)?,
            common,
        }),
        "text" => DomainSettings::Text(TextSettings {
            path,
            text: read(own)?,
            common,
        }),
        _ => DomainSettings::Audio(AudioSettings {
            path,
            audio: read(own)?,
            common,
        }),
    })
}

/// One group of settings from its keywords, an error naming the keyword.
fn read<T: DeserializeOwned>(part: Map<String, Value>) -> Result<T, KeywordError> {
    let only = (part.len() == 1)
        .then(|| part.keys().next().cloned())
        .flatten();
    serde_path_to_error::deserialize(Value::Object(part)).map_err(|e| {
        let path = e.path().to_string();
        let key = if path == "." {
            only.unwrap_or_default()
        } else {
            path
        };
        let message = e.into_inner().to_string();
        if message.starts_with("invalid type") {
            KeywordError::Type { key, message }
        } else {
            KeywordError::Value { key, message }
        }
    })
}

/// The field names a struct deserializes (as serde's derive lists them).
pub fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Names(Option<&'static [&'static str]>);
    impl<'de> Deserializer<'de> for &mut Names {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = Some(fields);
            Err(de::Error::custom("names taken"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut names = Names(None);
    let _ = T::deserialize(&mut names);
    names.0.unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kw(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn keywords_land_in_their_fields_with_the_defaults_elsewhere() {
        let s = from_keywords(
            "audio",
            Some("x".into()),
            &kw(serde_json::json!({
                "batch_size": 4, "chunk_seconds": 2.5, "features": "mel",
                "max_bytes_in_flight": "64MiB", "remote_retries": 2, "rank": null,
            })),
        )
        .unwrap();
        let DomainSettings::Audio(a) = s else {
            panic!("not audio")
        };
        assert_eq!(a.common.batch_size, 4);
        assert_eq!(a.common.max_bytes_in_flight, Some(64 << 20));
        assert_eq!(a.common.remote.remote_retries, 2);
        assert_eq!(a.audio.chunk_seconds, 2.5);
        assert_eq!(a.audio.features, crate::audio::FeaturesArg::Mel);
        assert_eq!(a.audio.n_mels, AudioOptions::default().n_mels);
        assert_eq!(a.common.rank, None);
    }

    #[test]
    fn bad_keywords_are_named_with_the_kind_of_fault() {
        use KeywordError::*;
        let e = |v| from_keywords("vision", None, &kw(v)).unwrap_err();
        let Unknown { key, .. } = e(serde_json::json!({"sizee": 3})) else {
            panic!("not unknown")
        };
        assert_eq!(key, "sizee");
        assert!(
            matches!(e(serde_json::json!({"batch_size": "64"})), Type { key, .. } if key == "batch_size")
        );
        assert!(
            matches!(e(serde_json::json!({"transform": "rotate"})), Value { key, .. } if key == "transform")
        );
        assert!(
            matches!(e(serde_json::json!({"workers": "many"})), Value { key, .. } if key == "workers")
        );
        assert!(
            matches!(e(serde_json::json!({"on_error": "ignore"})), Value { key, .. } if key == "on_error")
        );
        assert!(
            matches!(e(serde_json::json!({"autotune": "yes"})), Type { key, .. } if key == "autotune")
        );
        assert!(matches!(
            from_keywords("speech", None, &Map::new()),
            Err(Domain(_))
        ));
    }

    #[test]
    fn every_field_is_a_keyword_and_switches_are_known() {
        let k = keywords("text").unwrap();
        for name in [
            "max_tokens",
            "tokenizer",
            "seed",
            "remote_cache",
            "report_json",
        ] {
            assert!(k.iter().any(|(n, v)| *n == name && *v), "{name}");
        }
        for name in ["pack", "quiet", "shuffle", "prefetch"] {
            assert!(k.iter().any(|(n, v)| *n == name && !*v), "{name}");
        }
    }
}
