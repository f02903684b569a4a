#!/bin/bash
# scripts/run_resilient.sh — automatic recovery for a training run.
#
#   scripts/run_resilient.sh [--max-restarts N] [--delay S] [--metrics FILE] [--stop-signal SIG] [--] COMMAND [ARG...]
#   scripts/run_resilient.sh --max-restarts 10 -- mpirun -np 8 ./llmtrain job.json
#
# Runs COMMAND; when it exits non-zero, runs it again after S seconds, up to
# N restarts. llmtrain resumes by itself from the newest complete checkpoint
# (checkpoint.resume "auto"), so each attempt continues where the last
# complete checkpoint left off. Not restarted: exit 0 (done), 2 (bad input:
# a rerun fails the same way), 126 and 127 (the command cannot run) and 143 (stopped on request by SIGTERM or
# SIGUSR1), or this launcher was told to stop by SIGTERM, SIGINT or SIGUSR1:
# it sends the command its stop signal and exits with the command's code.
# The stop signal is SIGUSR1 when the command is mpirun, mpiexec, orterun,
# prterun or srun, also behind env, nice, nohup, stdbuf, taskset, numactl,
# chrt or ionice (Open MPI and srun pass SIGUSR1 on to every rank; mpirun
# answers SIGTERM by killing the ranks, SIGKILL 1 s after SIGTERM, too soon
# for a checkpoint, and exits 1; srun SIGKILLs them at once), else SIGTERM;
# --stop-signal TERM or USR1 chooses. Every attempt sees
# LLMTRAIN_ATTEMPT=1, 2, ... (the fault hook's attempt= key; forward it with
# mpirun -x across hosts).
#
# At the end it prints goodput: the time spent in training steps that count
# (the last logged occurrence of each step in metrics.jsonl, written since
# this launcher started; steps redone after a rollback count once) over the
# launcher's wall time. metrics.jsonl is the one llmtrain names on its
# "metrics:" start-up line, or --metrics FILE.
#
# If this launcher is killed (even by SIGKILL), the running command gets its
# stop signal within a fraction of a second: it writes its checkpoint and
# ends instead of training on orphaned.
#
# Exit code: 0, or the last attempt's code (see the README's exit codes).
# Options may also come from LLMTRAIN_MAX_RESTARTS and LLMTRAIN_RESTART_DELAY_S.
set -u
max_restarts=${LLMTRAIN_MAX_RESTARTS:-3}
delay=${LLMTRAIN_RESTART_DELAY_S:-1}
metrics=""
stop_sig=""
usage() { echo "usage: scripts/run_resilient.sh [--max-restarts N] [--delay S] [--metrics FILE] [--stop-signal SIG] [--] COMMAND [ARG...]" >&2; exit 2; }
fail() { echo "run_resilient: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --max-restarts) [ $# -ge 2 ] || usage; max_restarts=$2; shift 2 ;;
        --delay) [ $# -ge 2 ] || usage; delay=$2; shift 2 ;;
        --metrics) [ $# -ge 2 ] || usage; metrics=$2; shift 2 ;;
        --stop-signal) [ $# -ge 2 ] || usage; stop_sig=${2#SIG}; shift 2 ;;
        --) shift; break ;;
        -h|--help) usage ;;
        -*) fail "unknown option '$1' (expected --max-restarts, --delay, --metrics, --stop-signal or --)" ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || usage
[[ "$max_restarts" =~ ^[0-9]+$ ]] || fail "--max-restarts '$max_restarts': expected a whole number >= 0"
[[ "$delay" =~ ^[0-9]+([.][0-9]+)?$ ]] || fail "--delay '$delay': expected seconds >= 0"
if [ -z "$stop_sig" ]; then # the launcher's name, past env, nice, ... (which exec it) and their options
    stop_sig=TERM
    for w in "$@"; do
        case "${w##*/}" in
            mpirun|mpiexec|orterun|prterun|srun) stop_sig=USR1; break ;;
            env|nice|nohup|stdbuf|taskset|numactl|chrt|ionice|-*|*=*|[0-9]*) ;;
            *) break ;;
        esac
    done
fi
[ "$stop_sig" = TERM ] || [ "$stop_sig" = USR1 ] || fail "--stop-signal '$stop_sig': expected TERM or USR1"

meaning() {
    case "$1" in
        0) echo "finished" ;; 2) echo "bad input" ;; 3) echo "I/O failure" ;;
        4) echo "non-finite loss or gradients" ;; 5) echo "watchdog timeout: a hung step or collective" ;;
        6) echo "another rank failed" ;; 7) echo "slow fabric at the health check" ;;
        70) echo "internal error" ;; 126) echo "command not executable" ;; 127) echo "command not found" ;; 137) echo "killed by SIGKILL" ;; 143) echo "stopped by SIGTERM" ;;
        *) if [ "$1" -gt 128 ]; then echo "killed by signal $(($1 - 128))"; else echo "failed"; fi ;;
    esac
}

start_wall=$(date +%s.%N)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/metrics-lines
status=$tmp/status
stopped=$tmp/stopped
# stdout passes through a filter, line by line as it comes, that keeps only
# llmtrain's "metrics:" lines in $log: a copy of all of it would grow in
# $TMPDIR (often a tmpfs, so memory) for as long as the run lasts, weeks of
# step lines and samples, and stay behind if this launcher is SIGKILLed.
# (perl-base is part of every Debian system; mawk would hold the lines back.)
# It ignores the stop signals: sent to the whole process group (Ctrl-C at a
# terminal), they would end it, and the command's next line would meet a
# closed pipe (SIGPIPE) instead of its checkpoint; it ends at end of file.
exec 3>&1
exec > >(perl -e '$SIG{INT} = $SIG{TERM} = $SIG{USR1} = "IGNORE"; $| = 1; open(my $k, ">>", shift) or die "run_resilient: $!\n";
                  while (<STDIN>) { print; if (/^metrics: /) { print $k $_; $k->flush } }' "$log" >&3)
filter_pid=$!
# Each attempt runs under a small runner that writes the command's exit code
# to $status: bash's wait, interrupted by the stop signal's trap at the
# moment the command exits, returns 128 + the signal, and a second wait can
# hang. The runner sends the command its stop signal on the first SIGTERM or
# SIGUSR1 it gets (SIGINT stays ignored, as for any background job of a
# script) and exits with the command's code. A stop that came before the
# launcher knew the runner's pid is in the file $stopped: the runner does not
# start the command then, or stops it at once. (Signalling the runner that
# early could reach the shell bash forked for it before it became perl,
# which runs this script's traps, EXIT's removal of $tmp included.) When the
# launcher itself dies (SIGKILL runs no trap; a supervisor restarting it
# would meet a job still holding the checkpoint folder), the runner sees
# its parent change, sends the command its stop signal, removes $tmp and
# exits with the command's code: the command checkpoints and ends with it.
runner='my $st = shift; my $sig = shift; my $stopped = shift; my $launcher = shift; my ($pid, $stop);
$SIG{TERM} = $SIG{USR1} = sub { kill $sig, $pid if $pid && !$stop; $stop = 1 };
exit 143 if -e $stopped;
$pid = fork;
defined $pid or die "run_resilient: fork: $!\n";
if (!$pid) { $SIG{TERM} = $SIG{USR1} = "DEFAULT"; exec { $ARGV[0] } @ARGV;
             print STDERR "run_resilient: $ARGV[0]: $!\n"; exit($!{ENOENT} ? 127 : 126) }
kill $sig, $pid if $stop || -e $stopped;
my $orphan = 0;
while (waitpid($pid, 1) == 0) { # WNOHANG: the launcher gone (SIGKILL runs no trap) is a stop request
    if (!$orphan && getppid() != $launcher) {
        $orphan = 1;
        print STDERR "run_resilient: the launcher (pid $launcher) is gone; stopping the command (SIG$sig) so it checkpoints and ends with it\n";
        kill $sig, $pid unless $stop;
        $stop = 1;
    }
    select(undef, undef, undef, 0.2);
}
my $rc = $? & 127 ? 128 + ($? & 127) : $? >> 8;
if ($orphan) { (my $dir = $st) =~ s{/[^/]*$}{}; if (opendir(my $dh, $dir)) { unlink map { "$dir/$_" } grep { !/^\.\.?$/ } readdir $dh }
               rmdir $dir; exit $rc } # no launcher to read it
if (open(my $f, ">", $st)) { print $f "$rc\n"; close $f }
exit $rc;'
child=""
stopping=0
on_stop() {
    stopping=1
    : >"$stopped"
    [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
}
trap on_stop TERM INT USR1

attempt=0
rc=1
while :; do
    attempt=$((attempt + 1))
    t0=$(date +%s.%N)
    rm -f "$status"
    LLMTRAIN_ATTEMPT=$attempt perl -e "$runner" "$status" "$stop_sig" "$stopped" "$$" "$@" &
    child=$!
    while :; do
        wait "$child"; rc=$?
        # a trapped signal interrupts wait with a code > 128 while the child runs on
        kill -0 "$child" 2>/dev/null || break
    done
    child=""
    # the command's own code: when a stop signal came as it exited, wait's
    # code is the signal's, not the command's (none if the runner was killed)
    [ -s "$status" ] && rc=$(cat "$status")
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    [ "$rc" -eq 0 ] && break
    if [ "$stopping" = 1 ] || [ "$rc" -eq 143 ]; then
        echo "run_resilient: attempt $attempt stopped on request (exit $rc) after $secs s; not restarting" >&2; break
    fi
    if [ "$rc" -eq 2 ] || [ "$rc" -eq 126 ] || [ "$rc" -eq 127 ]; then
        echo "run_resilient: attempt $attempt exited with code $rc ($(meaning "$rc")) after $secs s; a restart would fail the same way" >&2; break
    fi
    if [ $((attempt - 1)) -ge "$max_restarts" ]; then
        echo "run_resilient: attempt $attempt exited with code $rc ($(meaning "$rc")) after $secs s; giving up after $max_restarts restart(s)" >&2; break
    fi
    echo "run_resilient: attempt $attempt exited with code $rc ($(meaning "$rc")) after $secs s; restarting in $delay s (restart $attempt of $max_restarts)" >&2
    sleep "$delay" & wait $!
    [ "$stopping" = 1 ] && { echo "run_resilient: stopped on request before restarting" >&2; break; }
done
exec >&3 3>&- # the filter sees end of file once every writer is gone
wait "$filter_pid" 2>/dev/null
end_wall=$(date +%s.%N)

[ -n "$metrics" ] || metrics=$(sed -n 's/^metrics: //p' "$log" | tail -n 1)
restarts=$((attempt - 1))
if [ -n "$metrics" ] && [ -f "$metrics" ]; then
    # the last line of each step counts; only lines written since this launcher started
    awk -v start="$start_wall" -v end="$end_wall" -v attempts="$attempt" -v restarts="$restarts" -v rc="$rc" '
        function num(key,   m) { if (match($0, "\"" key "\":[-0-9.eE+]+")) return substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3); return "" }
        /"loss"/ {
            s = num("step"); tm = num("time"); ms = num("step_ms")
            if (s == "" || tm == "" || ms == "" || tm + 0 < start + 0) next
            if (s in last) { redone++; redone_ms += last[s] }
            last[s] = ms
        }
        END {
            good = 0; n = 0
            for (s in last) { good += last[s] / 1000; n++ }
            wall = end - start
            how = "finished"
            if (rc != 0) how = "ended with exit code " rc
            pct = wall > 0 ? 100 * good / wall : 0
            printf "run_resilient: %s after %d attempt(s), %d restart(s) | goodput %.1f%%: %.1f s of %d training steps that count over %.1f s wall | %d step(s) redone after rollbacks (%.1f s)\n",
                   how, attempts, restarts, pct, good, n, wall, redone, redone_ms / 1000
        }' "$metrics" >&2
elif [ "$rc" -eq 2 ] || [ "$rc" -eq 126 ] || [ "$rc" -eq 127 ]; then
    : # the job never started training: the attempt's line said why, and no goodput applies
else
    echo "run_resilient: $([ "$rc" -eq 0 ] && echo finished || echo "ended with exit code $rc") after $attempt attempt(s), $restarts restart(s) | goodput unknown: no metrics.jsonl (pass --metrics FILE)" >&2
fi
exit "$rc"
