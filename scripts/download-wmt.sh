#!/usr/bin/env bash
# Download stage of the WMT recipes: fetch the archives of one dataset listed in
# scripts/wmt-sources.txt, verify their checksums, and extract them.
#
#   bash scripts/download-wmt.sh wmt14-en-de RAW_DIR
#   bash scripts/download-wmt.sh wmt16-en-ro RAW_DIR
#
# Idempotent: archives already present and verified are not fetched again, and
# archives already extracted are not extracted again. Set WMT_MIRROR=URL_PREFIX
# to fetch LOCAL_FILE from a mirror instead (same checksums apply).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATASET="${1:?usage: download-wmt.sh DATASET RAW_DIR}"
RAW="${2:?usage: download-wmt.sh DATASET RAW_DIR}"
mkdir -p "$RAW"
RECORD="$RAW/CHECKSUMS.recorded"
touch "$RECORD"

fetch() {  # url dest
    if command -v curl >/dev/null; then curl -fL --retry 3 -o "$2" "$1"; else wget -O "$2" "$1"; fi
}

digest() {  # algo file
    case "$1" in
        md5) md5sum "$2" | cut -d' ' -f1 ;;
        sha256) sha256sum "$2" | cut -d' ' -f1 ;;
        *) echo "unknown checksum algorithm $1" >&2; exit 2 ;;
    esac
}

verify() {  # file checksum
    local file="$1" sum="$2" name; name="$(basename "$1")"
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
        echo "ERROR: $name: $algo $actual, expected $want (corrupt or changed upstream)" >&2; return 1
    fi
}

found=0
while read -r dataset file url sum; do
    [[ -z "${dataset:-}" || "$dataset" == \#* || "$dataset" != "$DATASET" ]] && continue
    found=1
    dest="$RAW/$file"
    if [[ ! -f "$dest" ]]; then
        src="$url"; [[ -n "${WMT_MIRROR:-}" ]] && src="${WMT_MIRROR%/}/$file"
        echo "downloading $src"
        fetch "$src" "$dest.part"
        mv "$dest.part" "$dest"
    fi
    verify "$dest" "$sum"
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
done < "$HERE/wmt-sources.txt"
[[ "$found" == 1 ]] || { echo "unknown dataset $DATASET (see $HERE/wmt-sources.txt)" >&2; exit 2; }
echo "download stage done: $RAW"
