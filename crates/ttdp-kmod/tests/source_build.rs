//! Fetching a release tag and building it against the host's build tree, and every way that fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::process::Command;
use std::time::Duration;

use fixture::{Fixture, RELEASE, v};
use ttdp_kmod::{ModInfo, build_module, fetch_source};

fn tag_commit(fx: &Fixture, tag: &str) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(fx.repo.dir())
        .args(["rev-parse", &format!("{tag}^{{commit}}")])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_tag_builds_into_a_module_for_the_running_kernel() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let built = build_module(fx.sim.host(), RELEASE, &v("2.0.0"), &fx.build_options()).unwrap();
    assert_eq!(built.modinfo.version(), Some("2.0.0"));
    assert_eq!(built.modinfo.vermagic_release(), Some(RELEASE));
    assert_eq!(built.modinfo.name(), Some("tenstorrent"));
    assert_eq!(built.source_commit, tag_commit(&fx, "ttkmd-2.0.0"));
    assert_eq!(built.repository, fx.repo.url());
    assert!(built.log.contains("LD [M]"), "{}", built.log);
    let on_disk = ModInfo::from_file(&built.ko_path).unwrap();
    assert_eq!(on_disk, built.modinfo);

    let older = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap();
    assert_eq!(older.modinfo.version(), Some("1.0.0"));
    assert_ne!(older.modinfo.srcversion(), built.modinfo.srcversion());
    assert_ne!(older.source_commit, built.source_commit);
}

#[test]
fn the_build_directory_is_removed_when_done() {
    let fx = Fixture::new(&["1.0.0"]);
    let built = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap();
    let src = built.ko_path.parent().unwrap().to_path_buf();
    assert!(src.exists());
    drop(built);
    assert!(!src.exists());
}

#[test]
fn a_plain_local_path_works_as_repository() {
    let fx = Fixture::new(&["1.0.0"]);
    let dest = fx.dir.path().join("checkout");
    let (commit, _log) = fetch_source(
        fx.repo.dir().to_str().unwrap(),
        &v("1.0.0"),
        &dest,
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(commit, tag_commit(&fx, "ttkmd-1.0.0"));
    assert!(
        std::fs::read_to_string(dest.join("module.c"))
            .unwrap()
            .contains("version=1.0.0")
    );
}

#[test]
fn an_unknown_tag_is_a_fetch_error_naming_tag_and_repository() {
    let fx = Fixture::new(&["1.0.0"]);
    let err = build_module(fx.sim.host(), RELEASE, &v("9.9.9"), &fx.build_options()).unwrap_err();
    assert_eq!(err.reason(), "FetchFailed");
    let msg = err.to_string();
    assert!(
        msg.contains("ttkmd-9.9.9") && msg.contains(&fx.repo.url()),
        "{msg}"
    );
    assert!(msg.contains("check that the version exists"), "{msg}");
}

#[test]
fn sources_that_do_not_compile_are_a_build_error_with_the_log_tail() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.repo.add_broken_version("3.0.0").unwrap();
    let err = build_module(fx.sim.host(), RELEASE, &v("3.0.0"), &fx.build_options()).unwrap_err();
    assert_eq!(err.reason(), "BuildFailed");
    let msg = err.to_string();
    assert!(msg.contains("missing_symbol_in_ttkmd_source"), "{msg}");
    assert!(
        msg.contains("tt-kmd 3.0.0")
            && msg.contains("install")
            && msg.contains("linux-headers-6.8.0-sim"),
        "{msg}"
    );
}

#[test]
fn a_failing_build_tree_is_a_build_error() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.sim.fail_builds(true).unwrap();
    let err = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap_err();
    assert!(err.to_string().contains("simulated build failure"), "{err}");
    fx.sim.fail_builds(false).unwrap();
    build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap();
}

#[test]
fn missing_headers_say_which_package_to_install() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.sim.remove_headers().unwrap();
    let err = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap_err();
    assert_eq!(err.reason(), "HeadersMissing");
    assert!(
        err.to_string().contains("install linux-headers-6.8.0-sim"),
        "{err}"
    );
    fx.sim.install_headers().unwrap();
    build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap();
}

#[test]
fn a_tag_whose_module_declares_another_version_is_refused() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.repo.add_mislabelled_version("4.0.0", "3.9.9").unwrap();
    let err = build_module(fx.sim.host(), RELEASE, &v("4.0.0"), &fx.build_options()).unwrap_err();
    assert_eq!(err.reason(), "BuiltWrongModule");
    assert!(err.to_string().contains("3.9.9"), "{err}");
}

#[test]
fn building_for_a_release_other_than_the_tree_is_refused() {
    // The tree at /lib/modules/<release>/build builds for its own release; asking for another
    // release whose link points at it must not produce a module labelled for the wrong kernel.
    let fx = Fixture::new(&["1.0.0"]);
    let host = fx.sim.host();
    std::fs::create_dir_all(host.path("/lib/modules/6.9.9-other")).unwrap();
    std::os::unix::fs::symlink(
        "/usr/src/linux-headers-6.8.0-sim",
        host.path("/lib/modules/6.9.9-other/build"),
    )
    .unwrap();
    let err = build_module(host, "6.9.9-other", &v("1.0.0"), &fx.build_options()).unwrap_err();
    assert_eq!(err.reason(), "BuiltWrongModule");
}

#[test]
fn slow_fetches_and_builds_are_killed_at_their_timeout() {
    let fx = Fixture::new(&["1.0.0"]);
    let mut options = fx.build_options();
    options.build_timeout = Duration::from_millis(1);
    let err = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &options).unwrap_err();
    assert_eq!(err.reason(), "Timeout");
    assert!(
        err.to_string()
            .contains("building tt-kmd 1.0.0 for kernel 6.8.0-sim"),
        "{err}"
    );

    let mut options = fx.build_options();
    options.fetch_timeout = Duration::from_millis(1);
    let err = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &options).unwrap_err();
    assert_eq!(err.reason(), "Timeout");
    assert!(
        err.to_string().contains("fetching tag ttkmd-1.0.0"),
        "{err}"
    );
}

#[test]
fn what_could_become_a_path_or_a_git_option_is_no_version() {
    // build_module takes a KmdVersion, so these never get as far as a fetch
    for bad in [
        "latest",
        "1.0",
        "../../1.0.0",
        "1.0.0 --upload-pack=x",
        "-1.0.0",
    ] {
        let err = ttdp_kmod::KmodError::from(bad.parse::<ttdp_kmod::KmdVersion>().unwrap_err());
        assert_eq!(err.reason(), "InvalidVersion", "{bad}");
    }
}

#[test]
fn an_explicit_build_dir_replaces_the_host_root_tree() {
    let fx = Fixture::new(&["1.0.0"]);
    let tree = fx.sim.host().path("/usr/src/linux-headers-6.8.0-sim");
    let elsewhere = fx.dir.path().join("mounted-headers");
    std::fs::rename(&tree, &elsewhere).unwrap();
    let default_err =
        build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap_err();
    assert_eq!(default_err.reason(), "HeadersMissing");
    let options = ttdp_kmod::BuildOptions {
        build_dir: Some(elsewhere.clone()),
        ..fx.build_options()
    };
    let built = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &options).unwrap();
    assert_eq!(built.modinfo.vermagic_release(), Some(RELEASE));
    let options = ttdp_kmod::BuildOptions {
        build_dir: Some(fx.dir.path().join("nothing")),
        ..fx.build_options()
    };
    let err = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &options).unwrap_err();
    assert!(
        err.to_string().contains("nothing")
            && err.to_string().contains("install linux-headers-6.8.0-sim"),
        "{err}"
    );
}
