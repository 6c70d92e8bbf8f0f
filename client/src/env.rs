//! Attach arguments with defaults from the environment, as the Python client
//! and the PyTorch hook take them: `DLCP_SOCKET` (else [`DEFAULT_SOCKET`]),
//! `DLCP_JOB` (decimal or `0x` hex; else 0), `LOCAL_RANK` (else 0) and
//! `LOCAL_WORLD_SIZE` (else 1) — torchrun sets the last two. An argument given
//! explicitly wins over its variable; an empty variable counts as unset.

use std::path::PathBuf;

use thiserror::Error;

/// The daemon's default control socket (`control.socket_path`).
pub const DEFAULT_SOCKET: &str = "/run/dlcp/dlcpd.sock";

/// What to attach with; `None` fields come from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttachArgs {
    /// Control socket path (`$DLCP_SOCKET`, else [`DEFAULT_SOCKET`]).
    pub socket: Option<PathBuf>,
    /// Job id, the daemon's `node.job_id` (`$DLCP_JOB`, else 0).
    pub job: Option<u64>,
    /// This trainer's rank among the job's trainers on this host (`$LOCAL_RANK`, else 0).
    pub local_rank: Option<u32>,
    /// The job's trainers on this host (`$LOCAL_WORLD_SIZE`, else 1).
    pub local_world: Option<u32>,
}

/// The arguments with every default filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Control socket path.
    pub socket: PathBuf,
    /// Job id.
    pub job: u64,
    /// Local rank.
    pub local_rank: u32,
    /// Local world size.
    pub local_world: u32,
}

/// An environment variable that does not hold what it should.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("${name} is {value:?}, not {expected}")]
pub struct EnvError {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What it should hold.
    pub expected: &'static str,
}

fn parse_u64(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    }
}

impl AttachArgs {
    /// Every argument from the environment.
    pub fn from_env() -> AttachArgs {
        AttachArgs::default()
    }

    /// Fills the missing arguments from the process environment.
    pub fn resolve(&self) -> Result<Resolved, EnvError> {
        self.resolve_with(|name| std::env::var(name).ok())
    }

    /// Fills the missing arguments from `var` (the environment, or a stand-in in tests).
    pub fn resolve_with(&self, var: impl Fn(&str) -> Option<String>) -> Result<Resolved, EnvError> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let number = |name: &'static str, expected: &'static str, default: u64| match get(name) {
            None => Ok(default),
            Some(v) => parse_u64(&v).ok_or(EnvError { name, value: v, expected }),
        };
        let small = |name: &'static str, default: u32| {
            let n = number(name, "an integer", u64::from(default))?;
            u32::try_from(n).map_err(|_| EnvError {
                name,
                value: n.to_string(),
                expected: "an integer below 2^32",
            })
        };
        Ok(Resolved {
            socket: match &self.socket {
                Some(p) => p.clone(),
                None => PathBuf::from(get("DLCP_SOCKET").unwrap_or_else(|| DEFAULT_SOCKET.to_owned())),
            },
            job: match self.job {
                Some(j) => j,
                None => number("DLCP_JOB", "a job id (decimal or 0x hex)", 0)?,
            },
            local_rank: match self.local_rank {
                Some(r) => r,
                None => small("LOCAL_RANK", 0)?,
            },
            local_world: match self.local_world {
                Some(w) => w,
                None => small("LOCAL_WORLD_SIZE", 1)?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn defaults_then_the_environment_then_explicit_arguments() {
        let none = AttachArgs::from_env().resolve_with(env(&[])).unwrap();
        assert_eq!(none, Resolved { socket: DEFAULT_SOCKET.into(), job: 0, local_rank: 0, local_world: 1 });
        let vars = env(&[
            ("DLCP_SOCKET", "/tmp/d.sock"),
            ("DLCP_JOB", "0x10b"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", " 4 "),
        ]);
        let from_env = AttachArgs::from_env().resolve_with(&vars).unwrap();
        assert_eq!(
            from_env,
            Resolved { socket: "/tmp/d.sock".into(), job: 0x10b, local_rank: 2, local_world: 4 }
        );
        let explicit = AttachArgs {
            socket: Some("/x.sock".into()),
            job: Some(7),
            local_rank: Some(0),
            local_world: Some(1),
        };
        assert_eq!(
            explicit.resolve_with(&vars).unwrap(),
            Resolved { socket: "/x.sock".into(), job: 7, local_rank: 0, local_world: 1 }
        );
        let empty = env(&[("DLCP_JOB", ""), ("DLCP_SOCKET", " ")]);
        assert_eq!(AttachArgs::from_env().resolve_with(empty).unwrap(), none, "empty = unset");
    }

    #[test]
    fn a_bad_variable_is_named_with_its_value() {
        let e = AttachArgs::from_env().resolve_with(env(&[("DLCP_JOB", "seven")])).unwrap_err();
        assert_eq!(e.to_string(), "$DLCP_JOB is \"seven\", not a job id (decimal or 0x hex)");
        let e = AttachArgs::from_env().resolve_with(env(&[("LOCAL_RANK", "-1")])).unwrap_err();
        assert!(e.to_string().starts_with("$LOCAL_RANK is \"-1\""), "{e}");
        let e = AttachArgs::from_env().resolve_with(env(&[("LOCAL_WORLD_SIZE", "4294967296")])).unwrap_err();
        assert!(e.to_string().contains("below 2^32"), "{e}");
    }
}
