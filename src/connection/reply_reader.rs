//! Replies read as Redis writes them (RESP2), from a buffer of bytes received: the reader of
//! the pool's plain TCP connections ([`Wire`](super::wire::Wire)).
//!
//! redis-rs reads each reply through a general parser (combinator-built, for RESP2 and RESP3,
//! blocking and async), whose set-up and buffer handling cost a lock cycle's two short replies
//! more than the rest of the client's work for them together; this reader does only what a
//! RESP2 reply needs. It gives the same [`redis::Value`]s as redis-rs (`+OK` is
//! [`Value::Okay`](redis::Value::Okay), a nil bulk string or array is
//! [`Value::Nil`](redis::Value::Nil)), and leaves error replies to redis-rs's own parser, so
//! that they carry the same kinds and details as before.

use redis::{ErrorKind, RedisError, RedisResult, Value};

/// How deep arrays may nest in a reply (Redis's replies to this crate nest two or three
/// deep; a script's reply could nest more, never this deep).
const MAX_DEPTH: usize = 64;

/// Reads one reply from the start of `bytes`: `Ok(Some((reply, length)))` when it is all
/// there, `Ok(None)` when more bytes must come first, an error when the bytes are not a reply.
pub(super) fn read_reply(bytes: &[u8]) -> RedisResult<Option<(Value, usize)>> {
    let mut at = 0;
    Ok(reply(bytes, &mut at, 0)?.map(|value| (value, at)))
}

/// The reply at `*at`, which moves past it when it is whole.
fn reply(bytes: &[u8], at: &mut usize, depth: usize) -> RedisResult<Option<Value>> {
    let start = *at;
    let Some(line) = line(bytes, start + 1)? else {
        return Ok(None);
    };
    let text = &bytes[start + 1..line];
    let after = line + 2;
    let value = match bytes[start] {
        b'+' if text == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(utf8(text)?.to_owned()),
        b':' => Value::Int(integer(text)?),
        b'-' => return error(&bytes[start..after], at),
        b'$' => {
            let Some(length) = length(text)? else {
                *at = after;
                return Ok(Some(Value::Nil));
            };
            let end = after + length;
            if bytes.len() < end + 2 {
                return Ok(None);
            }
            if &bytes[end..end + 2] != b"\r\n" {
                return Err(garbled("a bulk string longer than its length"));
            }
            *at = end + 2;
            return Ok(Some(Value::BulkString(bytes[after..end].to_vec())));
        }
        b'*' => {
            let Some(count) = length(text)? else {
                *at = after;
                return Ok(Some(Value::Nil));
            };
            if depth >= MAX_DEPTH {
                return Err(garbled("arrays nested too deep"));
            }
            // Each element takes at least three bytes: no more room than that is made.
            let mut items = Vec::with_capacity(count.min((bytes.len() - after) / 3));
            *at = after;
            for _ in 0..count {
                match reply(bytes, at, depth + 1)? {
                    Some(item) => items.push(item),
                    None => {
                        *at = start;
                        return Ok(None);
                    }
                }
            }
            return Ok(Some(Value::Array(items)));
        }
        _ => return Err(garbled("a reply of a type that RESP2 does not have")),
    };
    *at = after;
    Ok(Some(value))
}

/// Where the line that starts at `from` ends (its `\r`), if its end has come.
fn line(bytes: &[u8], from: usize) -> RedisResult<Option<usize>> {
    let Some(newline) = bytes
        .get(from..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
    else {
        return Ok(None);
    };
    let end = from + newline;
    match end > from && bytes[end - 1] == b'\r' {
        true => Ok(Some(end - 1)),
        false => Err(garbled("a line that does not end with CRLF")),
    }
}

/// An error reply (`-CODE detail`), as redis-rs makes it.
fn error(whole: &[u8], at: &mut usize) -> RedisResult<Option<Value>> {
    let value = redis::parse_redis_value(whole)?;
    *at += whole.len();
    Ok(Some(value))
}

/// A bulk string's or an array's length; `None` for -1 (nil).
fn length(text: &[u8]) -> RedisResult<Option<usize>> {
    match integer(text)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .map(Some)
            .map_err(|_| garbled("a negative length")),
    }
}

fn integer(text: &[u8]) -> RedisResult<i64> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(garbled("an integer out of range"));
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(garbled("an integer with a character that is not a digit"));
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_sub(i64::from(d - b'0')))
            .ok_or_else(|| garbled("an integer out of range"))?;
    }
    // Summed as a negative number, so that i64::MIN fits.
    match negative {
        true => Ok(n),
        false => n
            .checked_neg()
            .ok_or_else(|| garbled("an integer out of range")),
    }
}

fn utf8(text: &[u8]) -> RedisResult<&str> {
    std::str::from_utf8(text).map_err(|_| garbled("a simple string that is not UTF-8"))
}

fn garbled(what: &'static str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "garbled reply from the server",
        what.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader gives what redis-rs's parser gives, for every kind of reply.
    #[test]
    fn reads_what_redis_rs_reads() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b":0\r\n",
            b":-42\r\n",
            b":9223372036854775807\r\n",
            b":-9223372036854775808\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\nab\r\nc\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n:1\r\n$-1\r\n*2\r\n+x\r\n$1\r\ny\r\n",
            b"-ERR unknown command\r\n",
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            b"-NOSCRIPT No matching script.\r\n",
            b"-MOVED 3999 127.0.0.1:6381\r\n",
            b"-MYCODE something else\r\n",
            b"*2\r\n-ERR inside\r\n:7\r\n",
        ];
        for &bytes in replies {
            let ours = read_reply(bytes).expect("a reply").expect("whole");
            let theirs = redis::parse_redis_value(bytes).expect("a reply");
            assert_eq!(
                ours,
                (theirs, bytes.len()),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    /// A reply cut anywhere is not read until it is whole, and one that follows is left.
    #[test]
    fn waits_for_a_whole_reply_and_leaves_the_next() {
        let bytes = b"*3\r\n:1\r\n$3\r\nabc\r\n-ERR no\r\n+OK\r\n";
        let whole = bytes.len() - 5;
        for cut in 0..whole {
            assert_eq!(read_reply(&bytes[..cut]).expect("no error"), None, "{cut}");
        }
        let (value, used) = read_reply(bytes).expect("a reply").expect("whole");
        assert_eq!(used, whole);
        assert!(matches!(value, Value::Array(ref items) if items.len() == 3));
        let next = read_reply(&bytes[used..]).expect("a reply").expect("whole");
        assert_eq!(next, (Value::Okay, 5));
    }

    /// Bytes that are no reply are an error of the connection, never a value.
    #[test]
    fn refuses_garbled_replies() {
        for bytes in [
            &b"?what\r\n"[..],
            b":12a\r\n",
            b":\r\n",
            b":99999999999999999999\r\n",
            b"$3\r\nabcd\r\n",
            b"$-2\r\n",
            b"+\xff\r\n",
            b"%1\r\n",
            b"+OK\n",
        ] {
            let err = read_reply(bytes).expect_err("garbled");
            assert_eq!(
                err.kind(),
                ErrorKind::Parse,
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(read_reply(deep.as_bytes()).is_err());
    }
}
