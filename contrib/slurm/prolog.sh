#!/bin/sh
# Patroller's Slurm prolog: records which job holds which GPU of this node, for the Patroller
# daemon (--slurm-job-map DIR) to read.
#
# slurmd runs it as root when a job is allocated this node (PrologFlags=Alloc; see
# slurm.conf.example). For every GPU index of the job it puts one line for the job in the file
# DIR/<index>:
#
#     <job id> uid=<uid> user=<user> account=<account> partition=<partition> [sluid=<sluid>]
#
# leaving out a key whose value Slurm did not give (SLURM_JOB_SLUID is there from Slurm 26.05,
# whose cgroups name the job by it). With PATROLLER_SLURM_MAP_IDS_ONLY=1 the line is the bare
# job id: the plain format (one job id per line) that other readers of such a map
# expect. A line for the same job id already in the file is replaced, never duplicated.
#
# DIR is $PATROLLER_SLURM_JOB_MAP, or /run/patroller/slurm-job-map; it is made (root's, 0755) if
# missing. Nothing is written in it unless it is a directory of root's, not a link, that only
# root may write to (as the daemon trusts it only then).
# Every change holds flock on DIR itself, is written to a temporary file whose name starts with
# a dot in DIR, and is moved over the old file: a reader sees the old file or the new one, never
# half of one, and skips names that start with a dot.
#
# It always exits 0: a prolog that fails drains the node. Problems go to stderr (slurmd's log)
# and to syslog through logger, where there is one.

# slurmd runs prologs and epilogs with no PATH in their environment.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
map_dir=${PATROLLER_SLURM_JOB_MAP:-/run/patroller/slurm-job-map}
job=${SLURM_JOB_ID-}
umask 022

say() {
    printf 'patroller slurm prolog: %s\n' "$*" >&2
    if command -v logger >/dev/null 2>&1; then
        logger -t patroller-slurm-prolog -p daemon.warning -- "$*" >/dev/null 2>&1
    fi
    return 0
}

# A value may go in a line only if it has no white space and no control character (a newline
# would make a line of its own).
plain() {
    case $1 in
        *[[:space:][:cntrl:]]*) return 1 ;;
    esac
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

# The GPUs: Slurm's GRES indices of the job's GPUs on this node, comma separated ("0,1").
# CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL are read only where SLURM_JOB_GPUS is not set
# at all: in the prolog slurmd sets them to the same GRES indices, which are not the job's own
# CUDA_VISIBLE_DEVICES (inside the job's device cgroup the job sees its GPUs as 0..n-1).
if [ "${SLURM_JOB_GPUS+set}" = set ]; then
    gpus=$SLURM_JOB_GPUS
elif [ "${CUDA_VISIBLE_DEVICES+set}" = set ]; then
    gpus=$CUDA_VISIBLE_DEVICES
else
    gpus=${GPU_DEVICE_ORDINAL-}
fi

# The line to add.
line() {
    if [ "${PATROLLER_SLURM_MAP_IDS_ONLY-}" = 1 ]; then
        printf '%s\n' "$job"
        return
    fi
    text=$job
    for pair in "uid=${SLURM_JOB_UID-}" "user=${SLURM_JOB_USER-}" \
            "account=${SLURM_JOB_ACCOUNT-}" "partition=${SLURM_JOB_PARTITION-}" \
            "sluid=${SLURM_JOB_SLUID-}"; do
        key=${pair%%=*}
        value=${pair#*=}
        [ -n "$value" ] || continue
        if [ "$key" = uid ]; then
            case $value in
                *[!0-9]*) say "job $job: uid '$value' is not a number; left out"; continue ;;
            esac
        fi
        if ! plain "$value"; then
            say "job $job: $key has white space or a control character; left out"
            continue
        fi
        text="$text $key=$value"
    done
    printf '%s\n' "$text"
}

# Every line of file $1 whose first word is not $job (blank lines dropped).
others() {
    source_file=$1
    [ -f "$source_file" ] || return 0
    while IFS= read -r kept || [ -n "$kept" ]; do
        set -f
        # shellcheck disable=SC2086 # split into words on purpose
        set -- $kept
        set +f
        [ $# -gt 0 ] || continue
        [ "$1" = "$job" ] || printf '%s\n' "$kept"
    done <"$source_file"
}

# Put this job's line in DIR/<index>, replacing one it had.
add() {
    file=$map_dir/$1
    temporary=$map_dir/.$1.$job.$$
    if { others "$file" && line; } >"$temporary" && mv -f "$temporary" "$file"; then
        return 0
    fi
    rm -f "$temporary"
    say "job $job: cannot write $file"
}

# With fd 9 open on DIR: lock it, then add the job to the file of every valid index.
update() {
    if command -v flock >/dev/null 2>&1; then
        if ! flock -w 60 9; then
            say "job $job: $map_dir stayed locked for 60 s; not recorded"
            return 0
        fi
    else
        say "no flock command (util-linux); writing $map_dir without the lock"
    fi
    old_ifs=$IFS
    IFS=,
    set -f
    # shellcheck disable=SC2086 # split at commas on purpose
    set -- $gpus
    set +f
    IFS=$old_ifs
    for index in "$@"; do
        case $index in
            '' | *[!0-9]*) say "job $job: GPU index '$index' is not a number; skipped"; continue ;;
        esac
        add "$index"
    done
}

case $job in
    '' | *[!0-9A-Za-z_.]*)
        say "job id '$job' (SLURM_JOB_ID) is empty or not of [0-9A-Za-z_.]; nothing recorded"
        exit 0
        ;;
esac
[ -n "$gpus" ] || exit 0  # a job without GPUs here: nothing to record
# shellcheck disable=SC2174 # parents get 0755 from the umask
if ! mkdir -p -m 0755 "$map_dir" 2>/dev/null || [ ! -d "$map_dir" ]; then
    say "job $job: cannot make $map_dir; nothing recorded"
    exit 0
fi
trusted "nothing recorded (make it root's: chown root; chmod 755)" || exit 0
update 9<"$map_dir" || say "job $job: cannot open $map_dir; nothing recorded"
exit 0
