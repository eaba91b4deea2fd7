#!/bin/sh
# Scenario "signing": signed modules with the real, static ttdp-agent binary on the real kernel
# (report in a file, no cluster). A key and certificate are made here with openssl (the host's,
# over the 9p /usr), in a directory standing for the Secret's volume; nothing of them is kept.
# The stub modules built on the host are seeded unsigned into the cache, so the agent re-signs
# them with the kernel's own sign-file (the host's linux-kbuild, over 9p):
#   1. install $OLD with the key: the cache entry is signed, `modinfo` shows the signer, the
#      appended PKCS#7 verifies against the certificate with `openssl smime -verify` (and not
#      against another one), the record and the report name the signer, the module without its
#      signature is the host-built stub; the kernel loads it (no enforcement yet) and says it
#      could not verify it: this guest trusts only Debian's keys;
#   2. enforcement on (`sig_enforce`, the kernel's enable-only switch, set at run time so that
#      an unsigned module could be loaded first; it is the parameter `module.sig_enforce=1`
#      sets at boot); /proc/keys shows the trusted keyrings;
#   3. $NEW unsigned (no key): refused before anything is unloaded, SignatureRequired, the
#      message says how to enroll a key or set spec.module.signing; $OLD stays loaded;
#   4. $NEW with the key: re-signed, but the kernel does not list the key: SignerNotTrusted
#      before anything is unloaded, with the mokutil steps; $OLD stays loaded;
#   5. the kernel itself refuses the module signed with the test's key, and an unsigned one,
#      while $OLD stays loaded: loading a self-signed module cannot be shown on this guest,
#      whose kernel trusts Debian's keys alone.
# Ends with a libtest-style summary line. Arguments are not used.
set -u

AGENT=/opt/ttdp/bin/ttdp-agent
WORK=/run/signing
REPORT=$WORK/report.json
CACHE=/var/cache/tt-kmd
RELEASE=$TTDP_VM_KERNEL_RELEASE
SECRET=$WORK/secret
SIGNER="ttdp vm signing test"
MARKER='~Module signature appended~'
MODINFO=$WORK/modinfo
set -- $TTDP_VM_KO_VERSIONS
OLD=$1
NEW=$2
STEP_LIMIT=90

SCENARIO=signing
. /scenario-lib.sh
standalone_agent_env

dump() {
  dump_agent "$1"
  echo "---- $1: module $(loaded_version), sig_enforce $(cat /sys/module/module/parameters/sig_enforce)"
  dmesg | tail -n 8
}

failed_with() { report_has '"phase": "Failed"' && report_has "\"reason\": \"$1\""; }
ready_for() { loaded_is "$1" && report_has '"phase": "Ready"' && report_has "\"loadedVersion\": \"$1\""; }
ko_of() { echo "$CACHE/$RELEASE/$1/tenstorrent.ko"; }

# start_agent NAME VERSION [signed]
start_agent() {
  AGENT_LOG=$WORK/agent-$1.log
  rm -f "$REPORT"
  if [ "${3:-}" = signed ]; then
    env TT_KMD_VERSION="$2" TTDP_MODULE_SIGNING_DIR="$SECRET" \
      TTDP_MODULE_SIGNING_SECRET=vm/test-signing "$AGENT" run >"$AGENT_LOG" 2>&1 &
  else
    env TT_KMD_VERSION="$2" "$AGENT" run >"$AGENT_LOG" 2>&1 &
  fi
  AGENT_PID=$!
  echo "signing: run $AGENT_LOG (pid $AGENT_PID): target $2 ${3:-unsigned}"
}

# make_key DIR NAME: tls.key and tls.crt in DIR, common name NAME (a config of its own: the
# guest's /etc has no openssl.cnf)
make_key() {
  mkdir -p "$1" &&
    printf '%s\n' '[req]' 'distinguished_name = dn' 'x509_extensions = v3' 'prompt = no' \
      '[dn]' "CN = $2" '[v3]' 'subjectKeyIdentifier = hash' \
      'basicConstraints = critical,CA:FALSE' 'extendedKeyUsage = codeSigning' >"$1/req.cnf" &&
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -config "$1/req.cnf" \
      -keyout "$1/tls.key" -out "$1/tls.crt" >/dev/null 2>&1
}

# split_signature KO: writes $WORK/content (the module as signed) and $WORK/sig.p7 (the PKCS#7)
# from the 12-byte module_signature block before the marker (its last 4 bytes: the length).
split_signature() {
  size=$(wc -c <"$1")
  set -- "$1" $(od -An -tu1 -j $((size - 28 - 4)) -N4 "$1")
  sig_len=$(($2 * 16777216 + $3 * 65536 + $4 * 256 + $5))
  content_len=$((size - 28 - 12 - sig_len))
  head -c "$content_len" "$1" >"$WORK/content" &&
    tail -c +$((content_len + 1)) "$1" | head -c "$sig_len" >"$WORK/sig.p7"
}

verifies_with() {
  openssl smime -verify -binary -inform DER -in "$WORK/sig.p7" -content "$WORK/content" \
    -certfile "$1" -nointern -noverify -out /dev/null >/dev/null 2>&1
}

mkdir -p "$WORK"
echo "signing: kernel $RELEASE, versions $OLD and $NEW"
require the_stub_modules_are_seeded_unsigned eval 'seed $OLD && seed $NEW && ! tail -c 28 "$(ko_of $OLD)" | grep -q -F "$MARKER"'
require a_test_key_is_made make_key "$SECRET" "$SIGNER"
# kmod's modinfo (it reads the signature; busybox's does not), by the name kmod answers to: the
# host's /usr/sbin/modinfo links to /bin/kmod, which is busybox's /bin here
require the_tools_are_there eval 'ln -s /usr/bin/kmod "$MODINFO" && ls /usr/lib/linux-kbuild-*/scripts/sign-file'

# --- 1. install with the key: signed, verified, reported -----------------------------------------
start_agent 1-signed "$OLD" signed
require the_signed_module_is_loaded wait_until "$STEP_LIMIT" ready_for "$OLD"
check the_cache_entry_carries_a_signature eval 'tail -c 28 "$(ko_of $OLD)" | grep -q -F "$MARKER"'
check modinfo_shows_the_signer eval '[ "$($MODINFO -F signer "$(ko_of $OLD)")" = "$SIGNER" ]'
check modinfo_shows_sha256 eval '[ "$($MODINFO -F sig_hashalgo "$(ko_of $OLD)")" = sha256 ]'
require the_signature_block_splits split_signature "$(ko_of $OLD)"
check the_signature_verifies_with_the_certificate verifies_with "$SECRET/tls.crt"
check the_signed_content_is_the_host_built_stub cmp -s "$WORK/content" "$TTDP_VM_KO_DIR/$OLD/tenstorrent.ko"
make_key "$WORK/other" "someone else"
check another_certificate_does_not_verify_it eval '! verifies_with "$WORK/other/tls.crt"'
check the_record_names_the_signer grep -q -F "\"signer\": \"$SIGNER\"" "$CACHE/$RELEASE/$OLD/tenstorrent.ko.json"
check the_report_names_the_signer report_has "\"moduleSigner\": \"$SIGNER\""
check the_cache_holds_no_private_key eval '! grep -r -q "PRIVATE KEY" "$CACHE"'
check the_kernel_could_not_verify_the_test_key eval 'dmesg | grep -q "module verification failed"'
stop_agent

# --- 2. enforcement on ---------------------------------------------------------------------------
require enforcement_is_switched_on eval 'echo 1 >/sys/module/module/parameters/sig_enforce && [ "$(cat /sys/module/module/parameters/sig_enforce)" = Y ]'
check the_kernel_lists_its_trusted_keyrings grep -q -E '\.(builtin|secondary)_trusted_keys' /proc/keys

# --- 3. an unsigned module is refused before the unload ------------------------------------------
start_agent 3-unsigned "$NEW"
require an_unsigned_module_is_refused wait_until "$STEP_LIMIT" failed_with SignatureRequired
check the_old_module_stays_loaded_unsigned loaded_is "$OLD"
check the_message_says_nothing_was_unloaded report_has "nothing was unloaded"
check the_message_says_how_to_enroll eval 'report_has "mokutil --import" && report_has "spec.module.signing"'
stop_agent

# --- 4. a key the kernel does not list is refused before the unload ------------------------------
start_agent 4-untrusted "$NEW" signed
require an_untrusted_signer_is_refused wait_until "$STEP_LIMIT" failed_with SignerNotTrusted
check the_old_module_stays_loaded_untrusted loaded_is "$OLD"
check the_new_entry_was_re_signed eval '[ "$($MODINFO -F signer "$(ko_of $NEW)")" = "$SIGNER" ]'
check the_message_gives_the_mokutil_steps eval 'report_has "mokutil --import cert.der" && report_has "MOK manager"'
stop_agent

# --- 5. the kernel's own refusal leaves the old module loaded ------------------------------------
check the_kernel_refuses_the_test_key eval '! busybox insmod "$(ko_of $NEW)" 2>/dev/null'
check the_kernel_refuses_an_unsigned_module eval '! busybox insmod "$TTDP_VM_KO_DIR/$NEW/tenstorrent.ko" 2>/dev/null'
check the_old_module_is_still_loaded loaded_is "$OLD"
check the_kernel_says_why eval 'dmesg | grep -q -i "rejected"'

finish
