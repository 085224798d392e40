//! Credentials: one secret per role, kept in a token file the controller creates.
//!
//! A *switch credential* lets a connection register a switch; a *host credential*
//! lets it create groups and communicators and read the status. Clients present
//! theirs in [`TOKEN_ENV`] (or `--token`). The controller keeps only SHA-256 digests
//! and compares digests in constant time, so neither the content nor the length of a
//! presented token shows in the time an answer takes.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use rand::RngCore as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

pub use inc_ctrl_proto::TOKEN_ENV;

/// What a credential allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Register switches and answer rule pushes.
    Switch,
    /// Create and destroy groups and communicators, read the status.
    Host,
}

impl Role {
    /// Name used in the token file and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Role::Switch => "switch",
            Role::Host => "host",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors reading or creating a token file.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The file could not be read or written.
    #[error("token file {path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// Group or others may read the file.
    #[error(
        "token file {path} is readable by group or others (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Exposed {
        /// File.
        path: PathBuf,
        /// Permission bits.
        mode: u32,
    },
    /// Another user owns the file: whoever that is could change the credentials.
    #[error("token file {path} is owned by {owner}, not by {user}, who runs the controller; run `chown {user} {path}` if that is intended")]
    ForeignOwner {
        /// File.
        path: PathBuf,
        /// Owner of the file (name and uid).
        owner: String,
        /// User running the controller (name and uid).
        user: String,
    },
    /// The content is not `switch <token>` and `host <token>` lines.
    #[error("token file {path}:{line}: {reason}")]
    Malformed {
        /// File.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// Shortest secret accepted from a token file: guessing must stay hopeless.
const MIN_TOKEN_LEN: usize = 16;

/// The two secrets of a controller.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    switch: String,
    host: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Secrets never reach logs.
        f.write_str("Credentials { .. }")
    }
}

fn random_token(role: Role) -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("inc-{}-{hex}", role.name())
}

impl Credentials {
    /// Fresh random credentials (256 bits each, from the OS).
    pub fn generate() -> Self {
        Credentials { switch: random_token(Role::Switch), host: random_token(Role::Host) }
    }

    /// Explicit credentials (tests, embedding).
    pub fn new(switch: impl Into<String>, host: impl Into<String>) -> Self {
        Credentials { switch: switch.into(), host: host.into() }
    }

    /// The credential of a role.
    pub fn token(&self, role: Role) -> &str {
        match role {
            Role::Switch => &self.switch,
            Role::Host => &self.host,
        }
    }

    /// Token file content.
    pub fn render(&self) -> String {
        format!(
            "# inc-controller credentials: keep this file private (mode 0600)\nswitch {}\nhost {}\n",
            self.switch, self.host
        )
    }

    /// Parse token file content (`path` names the file in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self, CredentialsError> {
        let bad = |line: usize, reason: String| CredentialsError::Malformed {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let (mut switch, mut host) = (None, None);
        for (i, l) in text.lines().enumerate() {
            let l = l.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let (role, token) = l
                .split_once(char::is_whitespace)
                .ok_or_else(|| bad(i + 1, "expected `switch TOKEN` or `host TOKEN`".into()))?;
            let token = token.trim();
            if token.len() < MIN_TOKEN_LEN || token.chars().any(char::is_whitespace) {
                return Err(bad(
                    i + 1,
                    format!("{role} token must be at least {MIN_TOKEN_LEN} characters, no spaces"),
                ));
            }
            let slot = match role {
                "switch" => &mut switch,
                "host" => &mut host,
                other => return Err(bad(i + 1, format!("unknown role `{other}`"))),
            };
            if slot.replace(token.to_string()).is_some() {
                return Err(bad(i + 1, format!("second `{role}` line")));
            }
        }
        match (switch, host) {
            (Some(switch), Some(host)) if switch != host => Ok(Credentials { switch, host }),
            (Some(_), Some(_)) => Err(bad(0, "switch and host tokens must differ".into())),
            _ => Err(bad(0, "needs one `switch TOKEN` and one `host TOKEN` line".into())),
        }
    }

    /// Read the token file, or create it (mode 0600, never overwriting) with fresh
    /// credentials when it does not exist. Returns whether it was created.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool), CredentialsError> {
        let io_err = |source| CredentialsError::Io { path: path.to_path_buf(), source };
        match Self::load(path) {
            Err(CredentialsError::Io { source, .. })
                if source.kind() == io::ErrorKind::NotFound => {}
            other => return other.map(|c| (c, false)),
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(io_err)?;
        }
        let creds = Credentials::generate();
        // create_new: a file (or symlink) planted at the path is never followed.
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io_err)?;
        f.write_all(creds.render().as_bytes()).map_err(io_err)?;
        f.sync_all().map_err(io_err)?;
        Ok((creds, true))
    }

    /// Read a token file; refuses one that group or others can read.
    pub fn load(path: &Path) -> Result<Self, CredentialsError> {
        let io_err = |source| CredentialsError::Io { path: path.to_path_buf(), source };
        let meta = fs::metadata(path).map_err(io_err)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(CredentialsError::Exposed { path: path.to_path_buf(), mode });
        }
        // Another user's file is not ours to trust, root's included: root can read it,
        // but its owner could have put any credentials in it.
        let uid = nix::unistd::Uid::effective();
        if meta.uid() != uid.as_raw() {
            return Err(CredentialsError::ForeignOwner {
                path: path.to_path_buf(),
                owner: user_label(meta.uid()),
                user: user_label(uid.as_raw()),
            });
        }
        let text = fs::read_to_string(path).map_err(io_err)?;
        Self::parse(path, &text)
    }
}

/// `name (uid N)`, or `uid N` for a uid without a name.
fn user_label(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("{} (uid {uid})", u.name),
        _ => format!("uid {uid}"),
    }
}

/// Credentials of a container deployment (`inc-controller export`), in one directory:
/// the controller's token file and one file per role holding only that role's
/// credential, so each container can be given exactly the secret its role needs.
pub const DEPLOYMENT_FILES: DeploymentFiles =
    DeploymentFiles { controller: "controller.token", switch: "switch.token", host: "host.token" };

/// File names in a deployment's secrets directory (see [`DEPLOYMENT_FILES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeploymentFiles {
    /// The controller's token file (both credentials, `serve --token-file`).
    pub controller: &'static str,
    /// The switch credential alone.
    pub switch: &'static str,
    /// The host credential alone.
    pub host: &'static str,
}

/// Create the credentials of a deployment in `dir` (created mode 0700): the
/// controller's token file is kept if it exists (so a running deployment's containers
/// stay valid) and created with fresh credentials otherwise; the per-role files are
/// written from it, mode 0600.
pub fn write_deployment_files(dir: &Path) -> Result<Credentials, CredentialsError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CredentialsError::Io { path, source }
    };
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err(dir))?;
    let (creds, _) = Credentials::load_or_create(&dir.join(DEPLOYMENT_FILES.controller))?;
    for (name, role) in
        [(DEPLOYMENT_FILES.switch, Role::Switch), (DEPLOYMENT_FILES.host, Role::Host)]
    {
        let path = dir.join(name);
        // Removed and created anew: a planted file or symlink is never written through.
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&path)(e)),
            _ => {}
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_err(&path))?;
        writeln!(f, "{}", creds.token(role)).map_err(io_err(&path))?;
    }
    Ok(creds)
}

type TokenDigest = [u8; 32];

fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// Who may do what: either every connection may do everything (`--insecure`) or a
/// connection must present a credential.
#[derive(Clone)]
pub enum Auth {
    /// No credentials required; every connection has every role.
    Insecure,
    /// Digests of the switch and host credentials.
    Required {
        /// SHA-256 of the switch credential.
        switch: TokenDigest,
        /// SHA-256 of the host credential.
        host: TokenDigest,
    },
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::Insecure => f.write_str("Insecure"),
            Auth::Required { .. } => f.write_str("Required { .. }"),
        }
    }
}

impl Auth {
    /// Require the given credentials.
    pub fn required(c: &Credentials) -> Self {
        Auth::Required { switch: digest(&c.switch), host: digest(&c.host) }
    }

    /// Whether connections must authenticate.
    pub fn is_required(&self) -> bool {
        matches!(self, Auth::Required { .. })
    }

    /// The role a presented token grants, if any. Both digests are always compared,
    /// in constant time, so timing tells nothing about the token or which role it
    /// nearly matched.
    pub fn role_of(&self, presented: Option<&str>) -> Option<Role> {
        match self {
            Auth::Insecure => None,
            Auth::Required { switch, host } => {
                let d = digest(presented.unwrap_or(""));
                let is_switch = d.ct_eq(switch);
                let is_host = d.ct_eq(host);
                if bool::from(is_switch) {
                    Some(Role::Switch)
                } else if bool::from(is_host) {
                    Some(Role::Host)
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_from_tokens() {
        let c = Credentials::new("switch-secret-0123456789", "host-secret-0123456789");
        let a = Auth::required(&c);
        assert_eq!(a.role_of(Some(c.token(Role::Switch))), Some(Role::Switch));
        assert_eq!(a.role_of(Some(c.token(Role::Host))), Some(Role::Host));
        assert_eq!(a.role_of(Some("host-secret-012345678")), None);
        assert_eq!(a.role_of(Some("")), None);
        assert_eq!(a.role_of(None), None);
        assert_eq!(Auth::Insecure.role_of(Some("x")), None);
        assert!(!format!("{c:?}{a:?}").contains("secret"), "secrets stay out of logs");
    }

    #[test]
    fn deployment_files_hold_one_credential_each() {
        let dir = std::env::temp_dir().join(format!("inc-auth-deploy-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let creds = write_deployment_files(&dir).unwrap();
        let read = |n: &str| fs::read_to_string(dir.join(n)).unwrap();
        assert_eq!(read(DEPLOYMENT_FILES.switch).trim(), creds.token(Role::Switch));
        assert_eq!(read(DEPLOYMENT_FILES.host).trim(), creds.token(Role::Host));
        for n in [DEPLOYMENT_FILES.controller, DEPLOYMENT_FILES.switch, DEPLOYMENT_FILES.host] {
            let mode = fs::metadata(dir.join(n)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{n}");
        }
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        // A second export keeps the controller's credentials.
        assert_eq!(write_deployment_files(&dir).unwrap(), creds);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn token_file_is_created_private_and_read_back() {
        let dir = std::env::temp_dir().join(format!("inc-auth-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let path = dir.join("sub/token");
        let (c, created) = Credentials::load_or_create(&path).unwrap();
        assert!(created);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(c.token(Role::Switch).starts_with("inc-switch-"));
        assert_eq!(c.token(Role::Host).len(), "inc-host-".len() + 64);
        let (again, created) = Credentials::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(again, c);

        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = Credentials::load(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Root too refuses another user's token file (needs root to give the file away).
    #[test]
    fn another_users_token_file_is_refused() {
        use std::os::unix::fs::chown;
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        let dir = std::env::temp_dir().join(format!("inc-auth-owner-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let path = dir.join("token");
        Credentials::load_or_create(&path).unwrap();
        chown(&path, Some(65534), None).unwrap();
        let e = Credentials::load(&path).unwrap_err();
        assert!(matches!(e, CredentialsError::ForeignOwner { .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains(&path.display().to_string()) && e.contains("uid 65534"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_token_files_name_the_line() {
        let p = Path::new("t");
        let e = Credentials::parse(p, "switch abcdefghijklmnopq\nhost short\n").unwrap_err();
        assert!(e.to_string().contains("t:2") && e.to_string().contains("16"), "{e}");
        let e = Credentials::parse(p, "switch abcdefghijklmnopq\n").unwrap_err();
        assert!(e.to_string().contains("host TOKEN"), "{e}");
        let e = Credentials::parse(p, "switch abcdefghijklmnopq\nhost abcdefghijklmnopq\n")
            .unwrap_err();
        assert!(e.to_string().contains("differ"), "{e}");
        let e = Credentials::parse(p, "admin abcdefghijklmnopq\n").unwrap_err();
        assert!(e.to_string().contains("unknown role `admin`"), "{e}");
        let c = Credentials::parse(p, "# c\nswitch abcdefghijklmnopq\nhost abcdefghijklmnopr\n");
        assert_eq!(c.unwrap().token(Role::Host), "abcdefghijklmnopr");
    }
}
