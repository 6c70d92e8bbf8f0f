//! `deploy/dlcp.toml` parses, validates, documents every setting, and states
//! the real defaults.

use std::path::PathBuf;

use dlcp_config::{Config, Reload, SETTINGS, reload_class};

fn example_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/dlcp.toml")
}

/// Load the example next to a generated `job.secret` (it names the file relatively).
fn load_example() -> (Config, String) {
    let text = std::fs::read_to_string(example_path()).unwrap();
    // One directory per call: tests run in parallel threads of one process.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("dlcp-deploy-example-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("job.secret"), [0x5a; 32]).unwrap();
    // Readable by its owner alone, or it is refused.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("job.secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let path = dir.join("dlcp.toml");
    std::fs::write(&path, &text).unwrap();
    let cfg = Config::load(&path);
    std::fs::remove_dir_all(&dir).unwrap();
    (cfg.unwrap_or_else(|e| panic!("deploy/dlcp.toml: {e}")), text)
}

#[test]
fn example_validates() {
    let (c, _) = load_example();
    assert_eq!((c.rank(), c.world_size()), (0, 4));
    assert_eq!(c.job_secret(), &[0x5a; 32]);
    assert!(c.peers.iter().all(|p| p.address.to_string().starts_with("10.77.0.")));
}

#[test]
fn example_without_secret_file_names_it() {
    // Loaded in place (no job.secret beside it), the error names the file and field.
    let e = Config::load(example_path()).unwrap_err();
    assert_eq!(e.field(), Some("node.job_secret_file"));
    assert!(e.to_string().contains("job.secret"), "{e}");
}

#[test]
fn example_states_the_real_defaults() {
    let (c, _) = load_example();
    // The same identity with nothing else set must be the same configuration.
    let mut minimal =
        String::from("[node]\nrank = 0\njob_id = 4242\njob_secret = \"placeholder-secret-0123\"\n");
    for p in &c.peers {
        minimal.push_str(&format!(
            "[[peers]]\nrank = {}\naddress = \"{}\"\nport = {}\n",
            p.rank, p.address, p.port
        ));
    }
    let d = Config::from_str_named(&minimal, "minimal.toml").unwrap();
    let diffs: Vec<String> = c
        .diff(&d)
        .into_iter()
        .filter(|ch| !ch.path.starts_with("node.job_secret"))
        .map(|ch| ch.to_string())
        .collect();
    assert!(diffs.is_empty(), "deploy/dlcp.toml differs from the defaults: {diffs:?}");
}

#[test]
fn example_mentions_every_setting_with_its_reload_class() {
    let (_, text) = load_example();
    for (path, reload) in SETTINGS {
        let key = path.rsplit('.').next().unwrap();
        let set = text.lines().any(|l| {
            let l = l.trim_start_matches(['#', ' ']);
            l.strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('='))
        });
        assert!(set, "deploy/dlcp.toml does not show `{path}`");
        assert_eq!(reload_class(path), *reload);
    }
    // Section banners carry the reload class.
    for (section, class) in
        [("[loss]", Reload::Runtime), ("[shm]", Reload::Restart), ("[priority]", Reload::Runtime)]
    {
        let tag = format!("[{class}]");
        let banner = text.lines().find(|l| l.starts_with(&format!("# {section}"))).unwrap();
        assert!(banner.contains(&tag), "{banner}");
    }
}

#[test]
fn example_error_in_header_is_what_dlcpd_prints() {
    // The header quotes an error for `budget = 0.25`; it must be exactly right.
    let text = std::fs::read_to_string(example_path()).unwrap();
    let quoted =
        text.lines().find(|l| l.contains("loss.budget: 0.25")).unwrap().trim_start_matches(['#', ' ']);
    let bad = text
        .replace("\nbudget = 0.01\n", "\nbudget = 0.25\n")
        .replace("job_secret_file = \"job.secret\"", "job_secret = \"0123456789abcdef\"");
    let e = Config::from_str_named(&bad, "/etc/dlcp/dlcp.toml").unwrap_err();
    assert_eq!(e.to_string(), quoted);
}
