#!/usr/bin/env bash
# A finished run's score cache (<run>/cache/, hundreds of small .npz files) lives in git as
# one archive beside it, <run>/cache.tar.xz; the extracted cache/ is ignored (.gitignore).
# The archive keeps the run reproducible bit for bit without hours of re-scoring, and the
# tree readable. It is packed deterministically (sorted names, fixed mtime, owner and
# modes, single-threaded xz), so packing an unchanged cache gives the same bytes.
#   score_cache.sh restore RUN_DIR   extract RUN_DIR/cache.tar.xz into RUN_DIR (if there is
#                                    one; entries already on disk are kept)
#   score_cache.sh pack RUN_DIR      write RUN_DIR/cache.tar.xz from RUN_DIR/cache/
set -euo pipefail
usage() { echo "usage: $0 restore|pack RUN_DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
run=${2%/}
archive="$run/cache.tar.xz"
case "$1" in
    restore)
        [ -f "$archive" ] || exit 0
        tar --skip-old-files -xJf "$archive" -C "$run"
        ;;
    pack)
        [ -d "$run/cache" ] || { echo "no $run/cache to pack" >&2; exit 2; }
        XZ_OPT='-6 -T1' tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
            --format=gnu --mode=u=rwX,go=rX -cJf "$archive.tmp" -C "$run" cache
        mv "$archive.tmp" "$archive"
        ;;
    *) usage ;;
esac
