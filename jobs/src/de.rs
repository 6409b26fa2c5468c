//! How settings read values that are text on the command line and typed
//! values elsewhere: a worker count (`"auto"` or a number), an error
//! policy (`"retry:3"`), a size (`"256MiB"` or a number of bytes), an eval
//! resize (`256`, `"256x320"` or `[256, 320]`).
//!
//! ```
//! use ferrofeed_jobs::CommonSettings;
//! let c: CommonSettings = serde_json::from_str(
//!     r#"{"workers": "auto", "max_bytes_in_flight": "64MiB", "on_error": "retry:2"}"#,
//! ).unwrap();
//! assert_eq!(c.max_bytes_in_flight, Some(64 << 20));
//! ```
use ferrofeed_core::{ErrorPolicy, Parallelism};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// A number or a text, as a setting may be given.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    Num(u64),
    Text(String),
}

fn num_or_text<'de, D: Deserializer<'de>>(
    d: D,
    expected: &'static str,
) -> Result<NumOrText, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    match v {
        serde_json::Value::Number(n) => n
            .as_u64()
            .map(NumOrText::Num)
            .ok_or_else(|| D::Error::custom(format!("{n} is not {expected}"))),
        serde_json::Value::String(s) => Ok(NumOrText::Text(s)),
        other => Err(D::Error::custom(format!(
            "invalid type: {}, expected {expected}",
            kind(&other)
        ))),
    }
}

/// What a JSON value is, as serde's messages name types.
fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "sequence",
        serde_json::Value::Object(_) => "map",
    }
}

/// `"auto"` or a worker count.
pub(crate) fn parallelism<'de, D: Deserializer<'de>>(d: D) -> Result<Parallelism, D::Error> {
    let text = match num_or_text(d, "\"auto\" or a worker count")? {
        NumOrText::Num(n) => n.to_string(),
        NumOrText::Text(t) => t,
    };
    text.parse().map_err(D::Error::custom)
}

/// An error policy as text (`fail`, `skip`, `retry:N`, `retry:N:skip`).
pub(crate) fn policy<'de, D: Deserializer<'de>>(d: D) -> Result<ErrorPolicy, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(D::Error::custom)
}

/// A size: a number of bytes or a text with a unit.
pub(crate) fn size<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    match num_or_text(d, "a size (bytes, or a text such as \"256MiB\")")? {
        NumOrText::Num(0) => Err(D::Error::custom("a size must be at least 1 byte")),
        NumOrText::Num(n) => usize::try_from(n).map_err(D::Error::custom),
        NumOrText::Text(t) => crate::parse_size(&t).map_err(D::Error::custom),
    }
}

/// A size, or nothing.
pub(crate) fn opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    #[derive(Deserialize)]
    struct Wrap(#[serde(deserialize_with = "size")] usize);
    Ok(Option::<Wrap>::deserialize(d)?.map(|w| w.0))
}

/// A size where 0 turns the thing off, or nothing.
pub(crate) fn opt_size_or_zero<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let v = Option::<serde_json::Value>::deserialize(d)?;
    match v {
        None => Ok(None),
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(0) => Ok(Some(0)),
        Some(v) => size(v).map(Some).map_err(D::Error::custom),
    }
}

/// An eval resize: the shorter side (a number), `"HxW"`, or `[H, W]`.
pub(crate) fn resize<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<ferrofeed_vision::ResizeTo, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    let text = match &v {
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(a) if a.len() == 2 && a.iter().all(|x| x.is_u64()) => {
            format!("{}x{}", a[0], a[1])
        }
        other => {
            return Err(D::Error::custom(format!(
                "invalid type: {}, expected a side (N), \"HxW\" or [H, W]",
                kind(other)
            )))
        }
    };
    text.parse().map_err(D::Error::custom)
}
