#!/bin/sh
# Patroller's Slurm epilog: forgets a finished job in the map of which job holds which GPU of
# this node that prolog.sh keeps (see there for the format).
#
# slurmd runs it as root when a job ends on this node. It removes the job's line (the line whose
# first word is SLURM_JOB_ID) from the file of every GPU: not only those in SLURM_JOB_GPUS but
# every file of DIR named like a GPU index (0, 1, ...) or a GPU index and a MIG GPU instance
# (0.1, ...), so that a line is not left behind when the indices the epilog is told differ from
# the prolog's. A file left with no line is removed.
#
# DIR is $PATROLLER_SLURM_JOB_MAP, or /run/patroller/slurm-job-map; nothing is changed in it
# unless it is a directory of root's, not a link, that only root may write to. Every change
# holds flock on DIR itself, is written to a temporary file whose name starts with a dot in DIR,
# and is moved over the old file (readers skip names that start with a dot).
#
# It always exits 0: an epilog that fails drains the node. Problems go to stderr (slurmd's log)
# and to syslog through logger, where there is one.

# slurmd runs prologs and epilogs with no PATH in their environment.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
map_dir=${PATROLLER_SLURM_JOB_MAP:-/run/patroller/slurm-job-map}
job=${SLURM_JOB_ID-}
umask 022

say() {
    printf 'patroller slurm epilog: %s\n' "$*" >&2
    if command -v logger >/dev/null 2>&1; then
        logger -t patroller-slurm-epilog -p daemon.warning -- "$*" >/dev/null 2>&1
    fi
    return 0
}

# Whether the map is a directory of ours (root's, under slurmd), not a link, that only we may
# write to: in one that another user may write to, they could put a link where we write as
# root, or lines of their own (and the daemon refuses such a map).
trusted() {
    if [ -L "$map_dir" ] || [ ! -d "$map_dir" ] || [ ! -O "$map_dir" ]; then
        say "job $job: $map_dir is a link, not a directory or not ours (uid $(id -u)): $1"
        return 1
    fi
    mode=$(stat -c %a "$map_dir" 2>/dev/null) || mode=unknown
    case $mode in
        unknown | *[2367]? | *[2367])
            say "job $job: $map_dir may be written by others than its owner (mode $mode): $1"
            return 1
            ;;
    esac
    return 0
}

# Whether file $1 has a line whose first word is $job.
holds() {
    source_file=$1
    while IFS= read -r kept || [ -n "$kept" ]; do
        set -f
        # shellcheck disable=SC2086 # split into words on purpose
        set -- $kept
        set +f
        [ $# -gt 0 ] && [ "$1" = "$job" ] && return 0
    done <"$source_file"
    return 1
}

# Every line of file $1 whose first word is not $job (blank lines dropped).
others() {
    source_file=$1
    while IFS= read -r kept || [ -n "$kept" ]; do
        set -f
        # shellcheck disable=SC2086 # split into words on purpose
        set -- $kept
        set +f
        [ $# -gt 0 ] || continue
        [ "$1" = "$job" ] || printf '%s\n' "$kept"
    done <"$source_file"
}

# Take the job's line out of DIR/<name>; remove the file when nothing is left.
remove() {
    file=$map_dir/$1
    temporary=$map_dir/.$1.$job.$$
    [ -f "$file" ] || return 0
    holds "$file" || return 0
    if others "$file" >"$temporary"; then
        if [ -s "$temporary" ]; then
            mv -f "$temporary" "$file" && return 0
        else
            rm -f "$temporary" && rm -f "$file" && return 0
        fi
    fi
    rm -f "$temporary"
    say "job $job: cannot rewrite $file"
}

# With fd 9 open on DIR: lock it, then take the job out of every file named like a GPU.
update() {
    if command -v flock >/dev/null 2>&1; then
        if ! flock -w 60 9; then
            say "job $job: $map_dir stayed locked for 60 s; its lines are left"
            return 0
        fi
    else
        say "no flock command (util-linux); writing $map_dir without the lock"
    fi
    for path in "$map_dir"/*; do
        name=${path##*/}
        case $name in
            '' | *[!0-9.]* | .* | *. | *.*.*) continue ;;  # [0-9]+ or [0-9]+.[0-9]+ only
        esac
        remove "$name"
    done
}

case $job in
    '' | *[!0-9A-Za-z_.]*)
        say "job id '$job' (SLURM_JOB_ID) is empty or not of [0-9A-Za-z_.]; nothing removed"
        exit 0
        ;;
esac
# The indices Slurm gives are only checked (all files are looked at anyway).
old_ifs=$IFS
IFS=,
set -f
# shellcheck disable=SC2086 # split at commas on purpose
set -- ${SLURM_JOB_GPUS-}
set +f
IFS=$old_ifs
for index in "$@"; do
    case $index in
        '' | *[!0-9]*) say "job $job: GPU index '$index' in SLURM_JOB_GPUS is not a number" ;;
    esac
done
[ -d "$map_dir" ] || exit 0  # nothing was ever recorded
trusted "its lines are left (make it root's: chown root; chmod 755)" || exit 0
update 9<"$map_dir" || say "job $job: cannot open $map_dir; its lines are left"
exit 0
