#!/usr/bin/env bash
# Download stage of the WMT recipes: fetch the archives of one dataset listed in
# scripts/wmt-sources.txt, verify their checksums, and extract them.
#
#   bash scripts/download-wmt.sh wmt14-en-de RAW_DIR
#   bash scripts/download-wmt.sh wmt16-en-ro RAW_DIR
#
# Every archive's size and checksum are checked against the published values in
# wmt-sources.txt (which cites their source); an archive without published values
# has the sha256 of its first download recorded and enforced on later runs. A file
# that fails is reported and not extracted; the others still are, and the script
# exits 1 at the end.
# Idempotent: archives already present are not fetched again (a rejected one is
# kept for inspection: delete it to fetch again), and archives already extracted
# are not extracted again. Set WMT_MIRROR=URL_PREFIX to fetch LOCAL_FILE from a
# mirror instead (same checksums apply); WMT_SOURCES=FILE reads another list.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATASET="${1:?usage: download-wmt.sh DATASET RAW_DIR}"
RAW="${2:?usage: download-wmt.sh DATASET RAW_DIR}"
SOURCES="${WMT_SOURCES:-$HERE/wmt-sources.txt}"
mkdir -p "$RAW"
RECORD="$RAW/CHECKSUMS.recorded"
touch "$RECORD"

fetch() {  # url dest: on failure, what went wrong and what to do offline, then exit 1
    local status=0
    if command -v curl >/dev/null; then curl -fL --retry 3 -o "$2" "$1" || status=$?; else wget -O "$2" "$1" || status=$?; fi
    [[ "$status" -ne 0 ]] || return 0
    rm -f "$2"
    local why="exit $status"
    case "$status" in
        6) why="curl exit 6: the host name does not resolve" ;;
        7) why="curl exit 7: no connection to the host" ;;
        28) why="curl exit 28: timed out" ;;
        22) why="curl exit 22: the server answered with an HTTP error" ;;
    esac
    echo "download-wmt: could not fetch $1 ($why; no network here?). Without internet: fetch the archives of" \
         "$DATASET listed in $SOURCES elsewhere and put them in $RAW (they are checked and extracted here), or" \
         "extract them yourself and give the prepare script --raw-dir DIR; WMT_MIRROR=URL_PREFIX fetches them from" \
         "a mirror" >&2
    exit 1
}

digest() {  # algo file
    case "$1" in
        md5) md5sum "$2" | cut -d' ' -f1 ;;
        sha256) sha256sum "$2" | cut -d' ' -f1 ;;
        *) echo "unknown checksum algorithm $1" >&2; exit 2 ;;
    esac
}

verify() {  # file checksum size
    local file="$1" sum="$2" size="$3" name; name="$(basename "$1")"
    if [[ "$size" != "-" ]]; then
        local bytes; bytes="$(wc -c < "$file" | tr -d ' ')"
        if [[ "$bytes" != "$size" ]]; then
            echo "ERROR: $name has $bytes bytes, expected $size (truncated, corrupt or changed upstream; delete it to fetch again)" >&2
            return 1
        fi
    fi
    if [[ "$sum" == "-" ]]; then
        local recorded; recorded="$(awk -v f="$name" '$1 == f {print $2}' "$RECORD")"
        local actual; actual="sha256:$(digest sha256 "$file")"
        if [[ -z "$recorded" ]]; then
            echo "$name $actual" >> "$RECORD"
            echo "WARNING: no published checksum for $name; recorded $actual in $RECORD (verified on later runs)" >&2
        elif [[ "$recorded" != "$actual" ]]; then
            echo "ERROR: $name has $actual but $RECORD recorded $recorded" >&2; return 1
        fi
        return 0
    fi
    local algo="${sum%%:*}" want="${sum#*:}" actual
    actual="$(digest "$algo" "$file")"
    if [[ "$actual" != "$want" ]]; then
        echo "ERROR: $name: $algo $actual, expected $want (corrupt or changed upstream; delete it to fetch again)" >&2
        return 1
    fi
}

found=0; failed=()
while read -r dataset file url sum size source; do
    [[ -z "${dataset:-}" || "$dataset" == \#* || "$dataset" != "$DATASET" ]] && continue
    found=1
    [[ -n "${sum:-}" && -n "${size:-}" && -n "${source:-}" ]] || { echo "malformed line for $file in $SOURCES" >&2; exit 2; }
    dest="$RAW/$file"
    if [[ ! -f "$dest" ]]; then
        src="$url"; [[ -n "${WMT_MIRROR:-}" ]] && src="${WMT_MIRROR%/}/$file"
        echo "downloading $src"
        fetch "$src" "$dest.part"
        mv "$dest.part" "$dest"
    fi
    verify "$dest" "$sum" "$size" || { failed+=("$file"); continue; }
    stamp="$RAW/.extracted-$file"
    if [[ ! -f "$stamp" ]]; then
        echo "extracting $file"
        case "$file" in
            *.tgz|*.tar.gz) tar -xzf "$dest" -C "$RAW" ;;
            *.zip) (cd "$RAW" && unzip -o -q "$file") ;;
            *) echo "don't know how to extract $file" >&2; exit 2 ;;
        esac
        touch "$stamp"
    fi
done < "$SOURCES"
[[ "$found" == 1 ]] || { echo "unknown dataset $DATASET (see $SOURCES)" >&2; exit 2; }
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "download stage FAILED verification: ${failed[*]} (in $RAW)" >&2; exit 1
fi
echo "download stage done: $RAW"
