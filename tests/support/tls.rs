//! TLS for tests: certificates made with the `openssl` command at test time (a CA, a server
//! certificate for 127.0.0.1 and localhost, a client certificate), and a `redis-server` that
//! listens with TLS on one port and without on another (for arranging and checking state).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{free_port, RedisServer};

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// A CA and the certificates it signed, in a temporary directory removed on drop.
pub struct TestCerts {
    dir: PathBuf,
}

impl TestCerts {
    /// Makes a new CA (P-256 keys, valid for two days) with a server certificate for
    /// `127.0.0.1` / `localhost` and a client certificate.
    pub fn generate() -> TestCerts {
        let dir = std::env::temp_dir().join(format!(
            "redmutex-certs-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the certificates' directory");
        let certs = TestCerts { dir };
        certs.openssl(
            "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
             -keyout ca.key -out ca.crt -days 2 -subj /CN=redmutex-test-ca \
             -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign,cRLSign",
        );
        certs.sign(
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        certs.sign("client", "extendedKeyUsage=clientAuth\n");
        certs
    }

    /// A key and a certificate `<name>.key` / `<name>.crt` signed by the CA.
    fn sign(&self, name: &str, extensions: &str) {
        let ext = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&ext),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"),
        )
        .expect("write the extensions file");
        self.openssl(&format!(
            "req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
             -keyout {name}.key -out {name}.csr -subj /CN=redmutex-test-{name}"
        ));
        self.openssl(&format!(
            "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
             -out {name}.crt -days 2 -extfile {ext}"
        ));
    }

    /// Runs `openssl` in the directory with whitespace-separated `args`.
    fn openssl(&self, args: &str) {
        let out = Command::new("openssl")
            .args(args.split_whitespace())
            .current_dir(&self.dir)
            .output()
            .expect("run openssl (is it installed? scripts/ensure-redis installs it)");
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The path of one of the files (`ca.crt`, `server.key`, `client.crt`…).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The contents of one of the files.
    pub fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).expect("read a certificate file")
    }

    /// The CA certificate, PEM.
    pub fn ca(&self) -> Vec<u8> {
        self.read("ca.crt")
    }

    /// The client certificate, PEM.
    pub fn client_cert(&self) -> Vec<u8> {
        self.read("client.crt")
    }

    /// The client certificate's private key, PEM.
    pub fn client_key(&self) -> Vec<u8> {
        self.read("client.key")
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether a TLS server asks clients for a certificate signed by its CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// `--tls-auth-clients no`
    Off,
    /// `--tls-auth-clients yes`
    Required,
}

/// A `redis-server` with a TLS port (certificates from its own [`TestCerts`]) and a plain
/// port; the server and the certificates go on drop.
pub struct TlsRedisServer {
    /// The server; its `url()`, `conn()` and `try_cmd()` use the plain port.
    pub server: RedisServer,
    /// The CA and certificates the server uses.
    pub certs: TestCerts,
    tls_port: u16,
}

impl TlsRedisServer {
    /// Starts a server with TLS on a free port, and extra `redis-server` arguments.
    pub fn start(client_auth: ClientAuth, extra: &[&str]) -> TlsRedisServer {
        let certs = TestCerts::generate();
        let tls_port = free_port();
        let path = |f: &str| certs.path(f).to_string_lossy().into_owned();
        let (tls_port_arg, cert, key, ca) = (
            tls_port.to_string(),
            path("server.crt"),
            path("server.key"),
            path("ca.crt"),
        );
        let auth = match client_auth {
            ClientAuth::Off => "no",
            ClientAuth::Required => "yes",
        };
        let mut args = vec![
            "--tls-port",
            &tls_port_arg,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            auth,
        ];
        args.extend_from_slice(extra);
        // The servers of the other versions tested (from PyPI wheels) are built without TLS.
        let server = RedisServer::start_binary("redis-server", &args);
        TlsRedisServer {
            server,
            certs,
            tls_port,
        }
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// `rediss://<credentials>127.0.0.1:<tls port>/`; `credentials` is empty or ends in `@`.
    pub fn tls_url(&self, credentials: &str) -> String {
        format!("rediss://{credentials}127.0.0.1:{}/", self.tls_port)
    }
}
