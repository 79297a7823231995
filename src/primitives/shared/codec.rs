//! How a shared value is stored: encoded through serde, behind a tag that names the codec.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, ErrorKind, Result};

/// The largest encoded value a [`Shared`](crate::Shared) writes, in bytes (16 MiB). A larger
/// one is refused with [`ErrorKind::InvalidArgument`] before anything is sent.
pub const MAX_VALUE_LEN: usize = 16 * 1024 * 1024;

/// Room beyond an encoding's expected size, for a change that makes it a little longer.
const SLACK: usize = 64;

/// How a [`Shared`](crate::Shared) value is encoded in Redis.
///
/// The stored bytes start with a tag that names the codec (`msgpack:` or `json:`), so that a
/// handle with another codec gets an [`ErrorKind::Decode`] error instead of garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Codec {
    /// MessagePack (`rmp-serde`, structs as maps of field names): compact and fast. The
    /// default.
    #[default]
    MessagePack,
    /// JSON (`serde_json`): readable in `redis-cli`, larger and slower.
    Json,
}

impl Codec {
    fn tag(self) -> &'static [u8] {
        match self {
            Codec::MessagePack => b"msgpack:",
            Codec::Json => b"json:",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Codec::MessagePack => "MessagePack",
            Codec::Json => "JSON",
        }
    }

    /// The stored bytes of `value`: the tag, then the encoding. `size_hint` is how long the
    /// bytes are likely to be (those of the value before a change; 0 when unknown): the buffer
    /// starts that large, so that a value of a kilobyte or more is not copied into a buffer
    /// twice as large again and again as it is encoded.
    pub(crate) fn encode<T: Serialize>(self, value: &T, size_hint: usize) -> Result<Vec<u8>> {
        let tag = self.tag();
        let mut bytes = Vec::with_capacity(size_hint.clamp(tag.len(), MAX_VALUE_LEN) + SLACK);
        bytes.extend_from_slice(tag);
        let encoded = match self {
            Codec::MessagePack => {
                rmp_serde::encode::write_named(&mut bytes, value).map_err(|e| e.to_string())
            }
            Codec::Json => serde_json::to_writer(&mut bytes, value).map_err(|e| e.to_string()),
        };
        if let Err(e) = encoded {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("the value cannot be encoded as {}: {e}", self.name()),
            ));
        }
        if bytes.len() > MAX_VALUE_LEN {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "the value is {} bytes encoded; the limit is {MAX_VALUE_LEN}",
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }

    /// The value of stored `bytes`, checked against the tag.
    pub(crate) fn decode<T: DeserializeOwned>(self, key: &str, bytes: &[u8]) -> Result<T> {
        let Some(body) = bytes.strip_prefix(self.tag()) else {
            let other = [Codec::MessagePack, Codec::Json]
                .into_iter()
                .find(|c| bytes.starts_with(c.tag()));
            let what = match other {
                Some(c) => format!("was written as {}", c.name()),
                None => "was not written by redmutex (no codec tag)".to_owned(),
            };
            return Err(Error::new(
                ErrorKind::Decode,
                format!(
                    "the value in {key:?} {what}; this handle reads {}",
                    self.name()
                ),
            ));
        };
        let decoded = match self {
            Codec::MessagePack => rmp_serde::from_slice(body).map_err(|e| e.to_string()),
            Codec::Json => serde_json::from_slice(body).map_err(|e| e.to_string()),
        };
        decoded.map_err(|e| {
            Error::new(
                ErrorKind::Decode,
                format!(
                    "the value in {key:?} does not decode from {} into {}: {e}",
                    self.name(),
                    std::any::type_name::<T>()
                ),
            )
        })
    }
}
