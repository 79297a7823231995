//! Commands packed as Redis reads them (RESP), without redis-rs's `Cmd` and `Pipeline`: the
//! hot paths (an uncontended acquire's plain commands, every script call) write each argument
//! once into one buffer, where a `Cmd` keeps each in a vector of its own and copies them all
//! again to send.

use std::io;

/// Commands packed one after another in one buffer, to be written at once.
#[derive(Default)]
pub(crate) struct Packed {
    bytes: Vec<u8>,
    commands: usize,
}

impl Packed {
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Packed {
            bytes: Vec::with_capacity(bytes),
            commands: 0,
        }
    }

    /// Starts a command of `args` arguments (its name among them), to be written next with
    /// [`bulk`](Self::bulk) and [`number`](Self::number).
    pub(crate) fn command(&mut self, args: usize) -> &mut Self {
        self.commands += 1;
        self.header(b'*', args);
        self
    }

    /// A command whose arguments are all given.
    pub(crate) fn command_of(&mut self, args: &[&[u8]]) -> &mut Self {
        self.command(args.len());
        for arg in args {
            self.bulk(arg);
        }
        self
    }

    /// One argument.
    pub(crate) fn bulk(&mut self, arg: &[u8]) -> &mut Self {
        write_bulk(&mut self.bytes, arg);
        self
    }

    /// One argument, a number in decimal.
    pub(crate) fn number(&mut self, n: u64) -> &mut Self {
        self.bulk(itoa::Buffer::new().format(n).as_bytes())
    }

    /// Arguments already packed ([`Args`]).
    pub(crate) fn args(&mut self, args: &Args) -> &mut Self {
        self.bytes.extend_from_slice(&args.bytes);
        self
    }

    fn header(&mut self, kind: u8, n: usize) {
        self.bytes.push(kind);
        self.bytes
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.bytes.extend_from_slice(b"\r\n");
    }

    /// How many commands are packed.
    pub(crate) fn len(&self) -> usize {
        self.commands
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

fn write_bulk(bytes: &mut Vec<u8>, arg: &[u8]) {
    bytes.push(b'$');
    bytes.extend_from_slice(itoa::Buffer::new().format(arg.len()).as_bytes());
    bytes.extend_from_slice(b"\r\n");
    bytes.extend_from_slice(arg);
    bytes.extend_from_slice(b"\r\n");
}

/// Arguments packed as bulk strings, counted: what any `ToRedisArgs` writes.
#[derive(Default, Clone)]
pub(crate) struct Args {
    bytes: Vec<u8>,
    count: usize,
}

impl Args {
    /// Room for `bytes` of packed arguments (a lock's keys and a token or two take some 200
    /// bytes: growing there would cost more than the rest of the packing).
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Args {
            bytes: Vec::with_capacity(bytes),
            count: 0,
        }
    }

    /// How many bytes the packed arguments take.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn push(&mut self, arg: impl redis::ToRedisArgs) {
        arg.write_redis_args(self);
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }
}

impl redis::RedisWrite for Args {
    fn write_arg(&mut self, arg: &[u8]) {
        write_bulk(&mut self.bytes, arg);
        self.count += 1;
    }

    fn writer_for_next_arg(&mut self) -> impl io::Write + '_ {
        NextArg {
            args: self,
            bytes: Vec::new(),
        }
    }
}

/// One argument being written: packed when done.
struct NextArg<'a> {
    args: &'a mut Args,
    bytes: Vec<u8>,
}

impl io::Write for NextArg<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for NextArg<'_> {
    fn drop(&mut self) {
        redis::RedisWrite::write_arg(self.args, &self.bytes);
    }
}

/// A pipeline's replies, each an error of its own where the server refused that command.
pub(crate) fn each_reply(replies: Vec<redis::Value>) -> Vec<redis::RedisResult<redis::Value>> {
    replies
        .into_iter()
        .map(|reply| match reply {
            redis::Value::ServerError(e) => Err(e.into()),
            reply => Ok(reply),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_as_redis_rs_does() {
        let mut packed = Packed::default();
        packed
            .command(6)
            .bulk(b"SET")
            .bulk(b"k")
            .bulk("tok:1".as_bytes())
            .bulk(b"NX")
            .bulk(b"PX")
            .number(30_000);
        packed.command_of(&[b"INCR", b"k:fence"]);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg("k")
            .arg("tok:1")
            .arg("NX")
            .arg("PX")
            .arg(30_000u64);
        pipe.cmd("INCR").arg("k:fence");
        assert_eq!(packed.as_bytes(), &pipe.get_packed_pipeline()[..]);
        assert_eq!(packed.len(), 2);
    }

    #[test]
    fn args_count_what_to_redis_args_writes() {
        let mut args = Args::default();
        args.push("a");
        args.push(42u64);
        args.push(&["x", "y"][..]);
        args.push(b"".as_slice());
        assert_eq!(args.count(), 5);
        let mut cmd = redis::cmd("X");
        cmd.arg("a")
            .arg(42u64)
            .arg(&["x", "y"][..])
            .arg(b"".as_slice());
        let expected = cmd.get_packed_command();
        // The command's header and name come first: `*6\r\n$1\r\nX\r\n`.
        assert_eq!(args.bytes, &expected[b"*6\r\n$1\r\nX\r\n".len()..]);
    }

    #[test]
    fn an_argument_written_in_parts_is_one() {
        use std::io::Write;
        let mut args = Args::default();
        {
            let mut w = redis::RedisWrite::writer_for_next_arg(&mut args);
            w.write_all(b"ab").unwrap();
            w.write_all(b"c").unwrap();
        }
        assert_eq!(args.count(), 1);
        assert_eq!(args.bytes, b"$3\r\nabc\r\n");
    }
}
