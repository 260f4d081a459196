#!/usr/bin/env bash
# Build the Debian package of the extension for PostgreSQL 15:
#   target/package/postgresql-15-litebase-streams_<version>-<revision>_<arch>.deb
#
# It holds exactly what scripts/install.sh installs, from the same build
# (`cargo pgrx package` into target/install-stage):
#   $(pg_config --pkglibdir)/litebase_streams.so            (stripped)
#   $(pg_config --sharedir)/extension/litebase_streams.control
#   $(pg_config --sharedir)/extension/litebase_streams--<version>.sql
#   $(pg_config --sharedir)/extension/litebase_streams--<A>--<B>.sql   (every step in sql/)
# plus usr/share/doc/<package>/{copyright,changelog.Debian.gz} from packaging/.
# No install script of an earlier version: those have security holes their
# upgrade steps close (see install.sh).
#
# The version is the extension's (Cargo.toml, the staged control file); the
# Debian revision and the maintainer come from packaging/changelog, whose
# newest entry must name this version. Depends is postgresql-15 plus what
# dpkg-shlibdeps finds the library links to.
#
#   package.sh             build into the stage when it is missing or older
#                          than the sources, then package it
#   package.sh --no-build  package the stage as it is (warns when stale)
#
# Runs lintian on the result when it is installed (apt-get install lintian):
# errors fail the build, warnings are printed.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$REPO_ROOT"
TARGET="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
STAGE="$TARGET/install-stage"
OUT="$TARGET/package"
PACKAGING="$REPO_ROOT/packaging"
PACKAGE=postgresql-15-litebase-streams

pkglibdir="$("$PG_CONFIG" --pkglibdir)"
extdir="$("$PG_CONFIG" --sharedir)/extension"
staged_lib="$STAGE$pkglibdir/$EXT_NAME.so"
staged_ext="$STAGE$extdir"

# Sources a build depends on that are newer than the staged library.
newer_sources() {
    find src sql core/src core/Cargo.toml Cargo.toml Cargo.lock "$EXT_NAME.control" \
        -type f -newer "$staged_lib" -print 2>/dev/null | head -n 5
}

build_stage() {
    rm -rf -- "$STAGE"
    say "cargo pgrx package --pg-config $PG_CONFIG --out-dir $STAGE"
    cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$STAGE"
}

ensure_stage() {
    local mode="$1" newer
    if [ ! -f "$staged_lib" ]; then
        [ "$mode" = build ] || die "nothing staged in $STAGE: run scripts/package.sh without --no-build (or scripts/install.sh)"
        build_stage
        return
    fi
    newer="$(newer_sources)"
    if [ -z "$newer" ]; then
        info "reusing the build staged in $STAGE"
    elif [ "$mode" = build ]; then
        info "the staged build is older than: $(echo "$newer" | tr '\n' ' ')"
        build_stage
    else
        warn "packaging the staged build although these are newer: $(echo "$newer" | tr '\n' ' ')"
    fi
}

# The staged extension directory must hold the control file, the install
# script of its default version and every upgrade step of sql/, nothing else
# (the set install.sh installs), and the steps must lead from every released
# version (a frozen install script in sql/) to the default one.
check_stage() {
    local version="$1" f name from
    [ -f "$staged_ext/$EXT_NAME--$version.sql" ] || die "staged install script missing: $staged_ext/$EXT_NAME--$version.sql"
    for f in sql/"$EXT_NAME"--*--*.sql; do
        name="$(basename "$f")"
        [ -f "$staged_ext/$name" ] || die "upgrade step $name is not in $staged_ext"
        cmp -s "$f" "$staged_ext/$name" || warn "the staged $name differs from $f (the stage is older)"
    done
    for f in "$staged_ext"/*; do
        name="$(basename "$f")"
        case "$name" in
            "$EXT_NAME.control" | "$EXT_NAME--$version.sql") ;;
            "$EXT_NAME"--*--*.sql) [ -f "sql/$name" ] || die "staged upgrade step $name is not in sql/" ;;
            *) die "unexpected file in the stage: $f" ;;
        esac
    done
    for f in sql/"$EXT_NAME"--*.sql; do
        name="$(basename "$f" .sql)"
        from="${name#"$EXT_NAME"--}"
        case "$from" in *--* | "$version") continue ;; esac
        reaches "$from" "$version" || die "no chain of upgrade steps in $staged_ext leads from $from to $version"
    done
}

# reaches FROM TO: the staged A--B steps lead from version FROM to TO.
reaches() {
    local from="$1" to="$2" step next
    [ "$from" = "$to" ] && return 0
    for step in "$staged_ext/$EXT_NAME--$from--"*.sql; do
        [ -f "$step" ] || continue
        next="${step##*--}"
        reaches "${next%.sql}" "$to" && return 0
    done
    return 1
}

# Fill in packaging/control.in; @NAME@ placeholders, values without '|'.
render_control() {
    local out="$1"; shift
    local script=() pair
    for pair in "$@"; do
        script+=(-e "s|@${pair%%=*}@|${pair#*=}|g")
    done
    sed "${script[@]}" "$PACKAGING/control.in" >"$out"
    if grep -q '@[A-Z_]*@' "$out"; then
        die "unfilled placeholder in $out: $(grep -o '@[A-Z_]*@' "$out" | head -n 1)"
    fi
}

# Depends: postgresql-15 and the shared libraries the library links to.
# dpkg-shlibdeps wants a debian/control naming the package and the binary
# under debian/<package>/; the library's undefined PostgreSQL symbols are
# resolved by the server at load time, hence --warnings=0.
shlib_depends() {
    local work="$1" lib="$2" line
    mkdir -p "$work/debian"
    printf 'Source: litebase-streams\n\nPackage: %s\nArchitecture: any\n' "$PACKAGE" >"$work/debian/control"
    line="$(cd "$work" && dpkg-shlibdeps -O --warnings=0 -e"${lib#"$work"/}")"
    printf '%s\n' "${line#shlibs:Depends=}"
}

main() {
    local mode=build version cargo_version changelog_version revision arch
    local deb root doc lib depends size

    case "${1:-}" in
        "") ;;
        --no-build) mode=no-build ;;
        *) die "usage: package.sh [--no-build]" ;;
    esac
    for tool in dpkg-deb dpkg-shlibdeps dpkg-parsechangelog strip; do
        command -v "$tool" >/dev/null 2>&1 || die "$tool not found (apt-get install dpkg-dev binutils)"
    done

    ensure_stage "$mode"
    version="$(sed -n "s/^default_version = '\(.*\)'$/\1/p" "$staged_ext/$EXT_NAME.control")"
    cargo_version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
    [ "$version" = "$cargo_version" ] \
        || die "the staged control file says $version, Cargo.toml $cargo_version: rebuild (package.sh without --no-build)"
    check_stage "$version"

    changelog_version="$(dpkg-parsechangelog -l "$PACKAGING/changelog" -S Version)"
    [ "${changelog_version%-*}" = "$version" ] \
        || die "packaging/changelog's newest entry is $changelog_version, the extension is $version: add an entry for $version-1"
    revision="${changelog_version##*-}"
    arch="$(dpkg --print-architecture)"
    deb="$OUT/${PACKAGE}_${version}-${revision}_${arch}.deb"

    say "package $PACKAGE $version-$revision ($arch)"
    rm -rf -- "$OUT"
    root="$OUT/build/debian/$PACKAGE"
    doc="$root/usr/share/doc/$PACKAGE"
    lib="$root$pkglibdir/$EXT_NAME.so"
    install -d -m 755 "$root/DEBIAN" "$root$pkglibdir" "$root$extdir" "$doc"

    # As dh_strip does: debugging symbols and notes out, the dynamic symbols in.
    install -m 644 "$staged_lib" "$lib"
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$lib"
    install -m 644 "$staged_ext"/* "$root$extdir/"
    install -m 644 "$PACKAGING/copyright" "$doc/copyright"
    gzip -9n <"$PACKAGING/changelog" >"$doc/changelog.Debian.gz"
    chmod 644 "$doc/changelog.Debian.gz"

    depends="postgresql-15, $(shlib_depends "$OUT/build" "$lib")"
    size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
    render_control "$root/DEBIAN/control" \
        "PACKAGE=$PACKAGE" "VERSION=$version-$revision" "EXT_VERSION=$version" "ARCH=$arch" \
        "MAINTAINER=$(dpkg-parsechangelog -l "$PACKAGING/changelog" -S Maintainer)" \
        "INSTALLED_SIZE=$size" "DEPENDS=$depends"
    (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) \
        >"$root/DEBIAN/md5sums"
    chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"

    dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
    info "built: $deb"
    info "Depends: $depends"

    if command -v lintian >/dev/null 2>&1; then
        say "lintian $(basename "$deb")"
        # Exit status 1 only for errors (the default --fail-on=error).
        lintian --display-info "$deb" || die "lintian found errors in $deb"
    else
        info "lintian not installed (apt-get install lintian): not checked"
    fi
}

main "$@"
