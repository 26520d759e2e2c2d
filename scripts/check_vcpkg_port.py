#!/usr/bin/env python3
"""Static checks of the vcpkg overlay port in ports/specula (vcpkg itself is not run).

    python3 scripts/check_vcpkg_port.py [--root <specula checkout>] [--port-dir <dir>]

Checks that
  * ports/specula/vcpkg.json parses, has the required fields, valid names, and the
    features/dependencies the port relies on (vcpkg-cmake/-config as host deps,
    features "cuda", "testing" and "range-v3" (none of them default but "testing"),
    boost-math in "testing", range-v3 only in its feature);
  * its version equals project(VERSION) in CMakeLists.txt and SPECULA_VERSION_STRING
    (and the MAJOR/MINOR/PATCH macros) in include/specula/version.hpp;
  * portfile.cmake calls vcpkg_cmake_configure / vcpkg_cmake_install /
    vcpkg_cmake_config_fixup, with CONFIG_PATH equal to where CMakeLists.txt installs
    the package files (SPECULA_INSTALL_CMAKEDIR, share/cmake/specula by default);
  * every -D option and vcpkg_check_features option the portfile passes exists in
    CMakeLists.txt, SPECULA_BUILD_TESTS/BENCH/EXAMPLES (and any other SPECULA_BUILD_*
    option not OFF by default) are passed as OFF, and every feature
    referenced by vcpkg_check_features is declared in vcpkg.json;
  * the debug and lib directories are removed (header-only), a copyright file is
    installed, and files the portfile reads from the port directory exist.

Exits 0 when everything passes, 1 on any problem (each one is printed), 2 on usage errors.
Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

PORT_NAME = "specula"
VERSION_FIELDS = ("version", "version-semver", "version-string", "version-date")
PORT_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
REQUIRED_FEATURES = ("cuda", "testing")
REQUIRED_HOST_DEPS = ("vcpkg-cmake", "vcpkg-cmake-config")
# Dependencies the port must declare, and where: None = top-level dependencies.
REQUIRED_DEPS = {"range-v3": "range-v3", "boost-math": "testing", "cuda": "cuda"}
REQUIRED_OFF_OPTIONS = ("SPECULA_BUILD_TESTS", "SPECULA_BUILD_BENCH", "SPECULA_BUILD_EXAMPLES")
# Defaults of GNUInstallDirs / project variables used to expand SPECULA_INSTALL_CMAKEDIR.
CMAKE_DEFAULTS = {
    "CMAKE_INSTALL_DATADIR": "share",
    "CMAKE_INSTALL_DATAROOTDIR": "share",
    "CMAKE_INSTALL_LIBDIR": "lib",
    "CMAKE_INSTALL_INCLUDEDIR": "include",
    "PROJECT_NAME": "specula",
}


class Checker:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.passed: list[str] = []

    def error(self, msg: str) -> None:
        self.errors.append(msg)

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def ok(self, msg: str) -> None:
        self.passed.append(msg)


def strip_cmake_comments(text: str) -> str:
    """Remove CMake comments (# ... and #[[ ... ]]) outside of quoted strings."""
    out = []
    i, n = 0, len(text)
    in_quote = False
    while i < n:
        c = text[i]
        if in_quote:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_quote = False
            i += 1
            continue
        if c == '"':
            in_quote = True
            out.append(c)
            i += 1
            continue
        if c == "#":
            m = re.match(r"#\[(=*)\[", text[i:])
            if m:
                end = text.find("]" + m.group(1) + "]", i + m.end())
                i = n if end < 0 else end + len(m.group(1)) + 2
                continue
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        out.append(c)
        i += 1
    return "".join(out)


def cmake_calls(text: str, name: str) -> list[str]:
    """Argument text of every call of command `name` (comments already stripped)."""
    calls = []
    for m in re.finditer(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"\s*\(", text, re.IGNORECASE):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
            i += 1
        calls.append(text[m.end():i - 1])
    return calls


def cmake_args(call_text: str) -> list[str]:
    """Split a CMake argument list into tokens (quotes removed)."""
    return [m.group(1) if m.group(1) is not None else m.group(2)
            for m in re.finditer(r'"((?:[^"\\]|\\.)*)"|([^\s"]+)', call_text)]


def dep_name(dep) -> str | None:
    if isinstance(dep, str):
        return dep
    if isinstance(dep, dict):
        return dep.get("name")
    return None


def check_manifest(chk: Checker, manifest_path: Path) -> dict | None:
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        chk.error(f"{manifest_path}: not found")
        return None
    except json.JSONDecodeError as e:
        chk.error(f"{manifest_path}: invalid JSON: {e}")
        return None
    if not isinstance(manifest, dict):
        chk.error(f"{manifest_path}: top level must be a JSON object")
        return None
    chk.ok("vcpkg.json parses as JSON")

    name = manifest.get("name")
    if name != PORT_NAME:
        chk.error(f"vcpkg.json: \"name\" is {name!r}, expected {PORT_NAME!r}")

    versions = [f for f in VERSION_FIELDS if f in manifest]
    if len(versions) != 1:
        chk.error(f"vcpkg.json: exactly one of {', '.join(VERSION_FIELDS)} is required "
                  f"(found: {', '.join(versions) or 'none'})")
    if "port-version" in manifest and (not isinstance(manifest["port-version"], int)
                                       or manifest["port-version"] < 0):
        chk.error("vcpkg.json: \"port-version\" must be a non-negative integer")

    # "homepage" is optional for an overlay port (the project has no public URL yet).
    for field in ("description",):
        value = manifest.get(field)
        if isinstance(value, list):
            value = " ".join(v for v in value if isinstance(v, str))
        if not isinstance(value, str) or not value.strip():
            chk.error(f"vcpkg.json: \"{field}\" is required and must be a non-empty string")
    homepage = manifest.get("homepage", "")
    if isinstance(homepage, str):
        if homepage and not re.match(r"^https?://", homepage):
            chk.error(f"vcpkg.json: \"homepage\" {homepage!r} is not an http(s) URL")
        if "TODO" in homepage:
            chk.warn(f"vcpkg.json: \"homepage\" is a placeholder ({homepage})")

    deps = manifest.get("dependencies", [])
    if not isinstance(deps, list):
        chk.error("vcpkg.json: \"dependencies\" must be an array")
        deps = []
    features = manifest.get("features", {})
    if not isinstance(features, dict):
        chk.error("vcpkg.json: \"features\" must be an object")
        features = {}

    def check_dep_list(where: str, dep_list) -> None:
        for dep in dep_list:
            n = dep_name(dep)
            if not isinstance(n, str) or not PORT_NAME_RE.match(n):
                chk.error(f"vcpkg.json: {where}: invalid dependency {dep!r}")
                continue
            if isinstance(dep, dict):
                for feat in dep.get("features", []):
                    fname = feat if isinstance(feat, str) else (feat or {}).get("name")
                    if not isinstance(fname, str) or not PORT_NAME_RE.match(fname):
                        chk.error(f"vcpkg.json: {where}: dependency {n}: invalid feature {feat!r}")
                if n == PORT_NAME and where != "dependencies":
                    for feat in dep.get("features", []):
                        fname = feat if isinstance(feat, str) else (feat or {}).get("name")
                        if fname not in features and fname not in ("core", "default"):
                            chk.error(f"vcpkg.json: {where}: depends on undeclared feature "
                                      f"{PORT_NAME}[{fname}]")

    check_dep_list("dependencies", deps)
    top_names = [dep_name(d) for d in deps]
    for host_dep in REQUIRED_HOST_DEPS:
        entry = next((d for d in deps if dep_name(d) == host_dep), None)
        if entry is None:
            chk.error(f"vcpkg.json: missing dependency {host_dep!r} (host)")
        elif not (isinstance(entry, dict) and entry.get("host") is True):
            chk.error(f"vcpkg.json: dependency {host_dep!r} must be declared with \"host\": true")
    if len(set(top_names)) != len(top_names):
        chk.error("vcpkg.json: duplicate entries in \"dependencies\"")

    for fname, feature in features.items():
        if not PORT_NAME_RE.match(fname) or fname in ("core", "default"):
            chk.error(f"vcpkg.json: invalid feature name {fname!r}")
        if not isinstance(feature, dict):
            chk.error(f"vcpkg.json: feature {fname!r} must be an object")
            continue
        desc = feature.get("description")
        if not (isinstance(desc, str) and desc.strip()) and not isinstance(desc, list):
            chk.error(f"vcpkg.json: feature {fname!r} needs a \"description\"")
        fdeps = feature.get("dependencies", [])
        if not isinstance(fdeps, list):
            chk.error(f"vcpkg.json: feature {fname!r}: \"dependencies\" must be an array")
            continue
        check_dep_list(f"feature {fname!r}", fdeps)

    for fname in REQUIRED_FEATURES:
        if fname not in features:
            chk.error(f"vcpkg.json: feature {fname!r} is not declared")

    for dep, where in REQUIRED_DEPS.items():
        if where is None:
            found = dep in top_names
            place = "\"dependencies\""
        else:
            fdeps = features.get(where, {}).get("dependencies", []) if isinstance(
                features.get(where), dict) else []
            found = dep in [dep_name(d) for d in fdeps] or dep in top_names
            place = f"feature {where!r} (or \"dependencies\")"
        if not found:
            chk.error(f"vcpkg.json: {dep!r} must be declared in {place}")

    # No specula header includes range-v3: it may only be an opt-in feature's dependency.
    if "range-v3" in top_names:
        chk.error("vcpkg.json: 'range-v3' is a plain dependency, but no specula header uses it "
                  "(declare it in the opt-in feature 'range-v3' only)")

    defaults = manifest.get("default-features", [])
    if not isinstance(defaults, list):
        chk.error("vcpkg.json: \"default-features\" must be an array")
        defaults = []
    for d in defaults:
        dname = d if isinstance(d, str) else (d or {}).get("name")
        if dname not in features:
            chk.error(f"vcpkg.json: default feature {dname!r} is not declared in \"features\"")

    if not chk.errors:
        chk.ok(f"vcpkg.json: fields, dependencies and features ({', '.join(features)}) present")
    return manifest


def read_project_version(chk: Checker, cmakelists: str) -> str | None:
    for args in cmake_calls(cmakelists, "project"):
        tokens = cmake_args(args)
        if tokens and tokens[0] == PORT_NAME and "VERSION" in tokens:
            i = tokens.index("VERSION")
            if i + 1 < len(tokens):
                return tokens[i + 1]
    chk.error("CMakeLists.txt: no project(specula VERSION <x.y.z> ...) found")
    return None


def read_header_version(chk: Checker, header_path: Path) -> str | None:
    try:
        text = header_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        chk.error(f"{header_path}: not found")
        return None
    m = re.search(r'^\s*#\s*define\s+SPECULA_VERSION_STRING\s+"([^"]*)"', text, re.M)
    if not m:
        chk.error(f"{header_path}: no SPECULA_VERSION_STRING definition")
        return None
    version = m.group(1)
    parts = {}
    for part in ("MAJOR", "MINOR", "PATCH"):
        pm = re.search(rf"^\s*#\s*define\s+SPECULA_VERSION_{part}\s+(\d+)", text, re.M)
        if pm:
            parts[part] = pm.group(1)
    if len(parts) == 3:
        joined = ".".join(parts[p] for p in ("MAJOR", "MINOR", "PATCH"))
        if joined != version:
            chk.error(f"{header_path}: SPECULA_VERSION_MAJOR/MINOR/PATCH give {joined} but "
                      f"SPECULA_VERSION_STRING is {version}")
    return version


def cmake_install_cmakedir(chk: Checker, cmakelists: str) -> str | None:
    for args in cmake_calls(cmakelists, "set"):
        tokens = cmake_args(args)
        if tokens and tokens[0] == "SPECULA_INSTALL_CMAKEDIR" and len(tokens) > 1:
            value = tokens[1]
            for var, default in CMAKE_DEFAULTS.items():
                value = value.replace("${" + var + "}", default)
            if "${" in value:
                chk.error(f"CMakeLists.txt: cannot expand SPECULA_INSTALL_CMAKEDIR default {value!r}")
                return None
            return value.strip("/")
    chk.error("CMakeLists.txt: no set(SPECULA_INSTALL_CMAKEDIR ...) found; cannot tell where "
              "the CMake package files are installed")
    return None


def cmake_options(cmakelists: str) -> dict[str, str]:
    """option(<name> "<help>" [<default>]) -> {name: default} (OFF when omitted)."""
    options = {}
    for args in cmake_calls(cmakelists, "option"):
        tokens = cmake_args(args)
        if tokens:
            options[tokens[0]] = tokens[2] if len(tokens) > 2 else "OFF"
    return options


def cmake_known_variables(cmakelists: str) -> tuple[set[str], set[str]]:
    """(options and cache variables, packages looked up with find_package)."""
    known: set[str] = set(cmake_options(cmakelists))
    for args in cmake_calls(cmakelists, "set"):
        tokens = cmake_args(args)
        if tokens and "CACHE" in tokens[1:]:
            known.add(tokens[0])
    packages = set()
    for args in cmake_calls(cmakelists, "find_package"):
        tokens = cmake_args(args)
        if tokens:
            packages.add(tokens[0])
    return known, packages


def check_option(chk: Checker, option: str, known: set[str], packages: set[str],
                 where: str) -> None:
    m = re.match(r"^CMAKE_(?:DISABLE|REQUIRE)_FIND_PACKAGE_(.+)$", option)
    if m:
        if m.group(1) not in packages:
            chk.error(f"portfile.cmake: {where}: {option} but CMakeLists.txt has no "
                      f"find_package({m.group(1)} ...)")
        return
    if option.startswith(("CMAKE_", "VCPKG_")):
        return  # CMake / vcpkg built-in variables
    if option not in known:
        chk.error(f"portfile.cmake: {where}: {option} is not an option() or cache variable "
                  f"of CMakeLists.txt")


def check_portfile(chk: Checker, port_dir: Path, root: Path, manifest: dict | None,
                   cmakelists: str) -> None:
    portfile_path = port_dir / "portfile.cmake"
    try:
        raw = portfile_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        chk.error(f"{portfile_path}: not found")
        return
    text = strip_cmake_comments(raw)
    # None: vcpkg.json did not parse (already reported); skip checks against it.
    features = None if manifest is None else set(manifest.get("features", {}) or {})

    for fn in ("vcpkg_cmake_configure", "vcpkg_cmake_install", "vcpkg_cmake_config_fixup"):
        n = len(cmake_calls(text, fn))
        if n != 1:
            chk.error(f"portfile.cmake: expected exactly one {fn}() call, found {n}")
    for fn in ("vcpkg_cmake_build", "vcpkg_copy_tools", "vcpkg_copy_pdbs",
               "vcpkg_configure_cmake", "vcpkg_install_cmake", "vcpkg_fixup_cmake_targets"):
        if cmake_calls(text, fn):
            chk.error(f"portfile.cmake: {fn}() is deprecated or produces compiled artefacts "
                      f"(header-only port)")

    known, packages = cmake_known_variables(cmakelists)

    # vcpkg_cmake_configure(SOURCE_PATH ... OPTIONS -D...)
    configure = cmake_calls(text, "vcpkg_cmake_configure")
    passed: dict[str, str] = {}
    if configure:
        tokens = cmake_args(configure[0])
        if "SOURCE_PATH" not in tokens:
            chk.error("portfile.cmake: vcpkg_cmake_configure() has no SOURCE_PATH")
        for tok in tokens:
            if tok.startswith("-D"):
                m = re.match(r"^-D([A-Za-z0-9_]+)(?::[A-Z]+)?=(.*)$", tok)
                if not m:
                    chk.error(f"portfile.cmake: cannot parse option {tok!r}")
                    continue
                passed[m.group(1)] = m.group(2)
                check_option(chk, m.group(1), known, packages, "vcpkg_cmake_configure")
        # SPECULA_BUILD_* options that are not plainly OFF by default must be switched off.
        build_options = {o for o, default in cmake_options(cmakelists).items()
                         if o.startswith("SPECULA_BUILD_") and default.upper() != "OFF"}
        for opt in sorted(set(REQUIRED_OFF_OPTIONS) | build_options):
            if passed.get(opt, "").upper() not in ("OFF", "FALSE", "0", "NO"):
                chk.error(f"portfile.cmake: vcpkg_cmake_configure must pass -D{opt}=OFF")
        for opt in REQUIRED_OFF_OPTIONS:
            if opt not in known:
                chk.error(f"CMakeLists.txt: option {opt} (switched off by the port) not found")

    # vcpkg_check_features(OUT_FEATURE_OPTIONS X FEATURES f OPT ... INVERTED_FEATURES f OPT ...)
    feature_options_var = None
    for call in cmake_calls(text, "vcpkg_check_features"):
        tokens = cmake_args(call)
        mode = None
        pairs: list[str] = []
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok in ("OUT_FEATURE_OPTIONS", "PREFIX"):
                if tok == "OUT_FEATURE_OPTIONS" and i + 1 < len(tokens):
                    feature_options_var = tokens[i + 1]
                i += 2
                continue
            if tok in ("FEATURES", "INVERTED_FEATURES"):
                mode = tok
                i += 1
                continue
            if mode is None:
                chk.error(f"portfile.cmake: vcpkg_check_features: unexpected {tok!r}")
            else:
                pairs.append(tok)
            i += 1
        if len(pairs) % 2:
            chk.error("portfile.cmake: vcpkg_check_features: odd number of feature/option tokens")
        for feat, opt in zip(pairs[0::2], pairs[1::2]):
            if features is not None and feat not in features:
                chk.error(f"portfile.cmake: vcpkg_check_features uses feature {feat!r}, "
                          f"which vcpkg.json does not declare")
            check_option(chk, opt, known, packages, f"vcpkg_check_features({feat})")
    if feature_options_var and configure and "${" + feature_options_var + "}" not in configure[0]:
        chk.error(f"portfile.cmake: ${{{feature_options_var}}} from vcpkg_check_features is not "
                  f"passed to vcpkg_cmake_configure")

    # vcpkg_cmake_config_fixup(CONFIG_PATH ...) must match SPECULA_INSTALL_CMAKEDIR.
    install_dir = cmake_install_cmakedir(chk, cmakelists)
    fixup = cmake_calls(text, "vcpkg_cmake_config_fixup")
    if fixup:
        tokens = cmake_args(fixup[0])
        config_path = None
        if "CONFIG_PATH" in tokens and tokens.index("CONFIG_PATH") + 1 < len(tokens):
            config_path = tokens[tokens.index("CONFIG_PATH") + 1].strip("/")
        package_name = PORT_NAME
        if "PACKAGE_NAME" in tokens and tokens.index("PACKAGE_NAME") + 1 < len(tokens):
            package_name = tokens[tokens.index("PACKAGE_NAME") + 1]
        effective = config_path or f"share/{package_name}"
        if install_dir is not None and effective != install_dir:
            chk.error(f"portfile.cmake: vcpkg_cmake_config_fixup CONFIG_PATH is {effective!r} "
                      f"but CMakeLists.txt installs the package files to {install_dir!r}")
        elif install_dir is not None:
            chk.ok(f"config fixup path {effective} matches CMake's install location")
        if package_name != PORT_NAME:
            chk.error(f"portfile.cmake: PACKAGE_NAME {package_name!r} differs from the "
                      f"find_package name {PORT_NAME!r}")
    if "specula-config.cmake" not in cmakelists:
        chk.error("CMakeLists.txt: does not install specula-config.cmake")

    # Header-only: no debug tree, no lib directory.
    removes = " ".join(cmake_calls(text, "file"))
    for sub in ("debug", "lib"):
        if not re.search(r"REMOVE_RECURSE[^)]*\$\{CURRENT_PACKAGES_DIR\}/" + sub + r"\b", removes):
            chk.error(f"portfile.cmake: does not remove ${{CURRENT_PACKAGES_DIR}}/{sub} "
                      f"(header-only port)")

    # Copyright.
    if not (cmake_calls(text, "vcpkg_install_copyright")
            or re.search(r"RENAME\s+copyright", text)):
        chk.error("portfile.cmake: installs no copyright file "
                  "(vcpkg_install_copyright or file(INSTALL ... RENAME copyright))")
    if not (root / "LICENSE").exists():
        chk.error("the repository has no LICENSE file (the port installs it as its copyright)")

    # Files read from the port directory must exist.
    for m in re.finditer(r"\$\{(?:CMAKE_CURRENT_LIST_DIR|CURRENT_PORT_DIR)\}/([A-Za-z0-9_.\-/]+)",
                         text):
        rel = m.group(1)
        if rel.startswith(".."):
            continue
        if not (port_dir / rel).exists():
            chk.error(f"portfile.cmake: references {rel}, which does not exist in {port_dir}")

    # Source location: either fetched, or a checkout that must be a specula tree.
    if not (cmake_calls(text, "vcpkg_from_github") or cmake_calls(text, "vcpkg_from_git")
            or re.search(r"set\s*\(\s*SOURCE_PATH|\(\s*SOURCE_PATH\s", text)):
        chk.error("portfile.cmake: SOURCE_PATH is never set")
    if re.search(r'"\$\{CMAKE_CURRENT_LIST_DIR\}/\.\./\.\."', text):
        default_source = (port_dir / ".." / "..").resolve()
        if not (default_source / "CMakeLists.txt").exists():
            chk.error(f"portfile.cmake: default source tree {default_source} has no CMakeLists.txt")

    if not chk.errors:
        chk.ok("portfile.cmake: vcpkg_cmake_configure/install/config_fixup, options, "
               "cleanup and copyright")


def main(argv: list[str]) -> int:
    default_root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=default_root,
                    help="specula checkout (default: %(default)s)")
    ap.add_argument("--port-dir", type=Path, default=None,
                    help="port directory (default: <root>/ports/specula)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    args = ap.parse_args(argv)

    root = args.root.resolve()
    port_dir = (args.port_dir or root / "ports" / PORT_NAME).resolve()
    if not port_dir.is_dir():
        print(f"check_vcpkg_port: port directory {port_dir} not found", file=sys.stderr)
        return 2
    try:
        cmakelists = strip_cmake_comments((root / "CMakeLists.txt").read_text(encoding="utf-8"))
    except FileNotFoundError:
        print(f"check_vcpkg_port: {root}/CMakeLists.txt not found", file=sys.stderr)
        return 2

    chk = Checker()
    manifest = check_manifest(chk, port_dir / "vcpkg.json")

    project_version = read_project_version(chk, cmakelists)
    header_version = read_header_version(chk, root / "include" / "specula" / "version.hpp")
    if manifest is not None:
        field = next((f for f in VERSION_FIELDS if f in manifest), None)
        port_version = manifest.get(field) if field else None
        if project_version and port_version != project_version:
            chk.error(f"vcpkg.json {field} {port_version!r} != project(VERSION) "
                      f"{project_version!r} in CMakeLists.txt")
        if header_version and port_version != header_version:
            chk.error(f"vcpkg.json {field} {port_version!r} != SPECULA_VERSION_STRING "
                      f"{header_version!r} in include/specula/version.hpp")
        if project_version and port_version == project_version == header_version:
            chk.ok(f"version {port_version} matches CMakeLists.txt and version.hpp")

    check_portfile(chk, port_dir, root, manifest, cmakelists)

    if not args.quiet:
        for msg in chk.passed:
            print(f"ok:      {msg}")
    for msg in chk.warnings:
        print(f"warning: {msg}")
    for msg in chk.errors:
        print(f"error:   {msg}", file=sys.stderr)
    if chk.errors:
        print(f"check_vcpkg_port: {len(chk.errors)} problem(s) in {port_dir}", file=sys.stderr)
        return 1
    print(f"check_vcpkg_port: {port_dir} OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
