package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/bench"
)

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return fmt.Sprint(*m) }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runBench(ctx context.Context, args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable_bench")
	var scenarios multiFlag
	fs.Var(&scenarios, "scenario", "scenario to run (repeatable; default all available)")
	n := fs.Int("n", 0, "size of each scenario (default: the scenario's own)")
	conc := fs.Int("concurrency", 100, "queue concurrency of the benchmarked client")
	prefetch := fs.Int("prefetch", 0, "rows the benchmarked client's picks may claim beyond its free executors (QueueConfig.Prefetch)")
	clients := fs.Int("clients", 1, "clients (nodes) working the queue together in jobs, chain, gated and rated")
	processes := fs.Int("processes", 0, "jobs and chain: worker processes (each a client on a pool of its own) instead of in-process clients; adds the database's transactions and statement time per job")
	worker := fs.String("worker", "", "run as one worker process of --processes for this scenario (internal)")
	preload := fs.Int("preload", 0, "finished rows to insert before each scenario (a large table)")
	preloadLive := fs.Int("preload-live", 0, "live rows no scenario runs (parked, scheduled a day ahead) to insert before each scenario")
	duration := fs.Duration("duration", 0, "soak: how long the load runs (default 1h)")
	rate := fs.Float64("rate", 0, "soak: instances inserted a second (default 1000)")
	window := fs.Duration("window", 0, "soak: how often it reports (default 1m)")
	retention := fs.Duration("retention", 0, "soak: GC's retention of finished instances (default the library's)")
	asJSON := fs.Bool("json", false, "print one JSON object per scenario per line")
	poke := fs.String("poke", "local", "the in-process clients' poke transport: local (PokeLocal) or postgres (PokePostgres)")
	sealed := fs.Bool("codec", false, "the benchmarked clients seal payloads (Config.Codec: AES-256-GCM, a throwaway key)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	samples := fs.String("samples", "", "write one CSV line per pickup of latency and latency-remote to this file (scenario, at_ms, total_ms, insert_ms)")
	memProfile := fs.String("memprofile", "", "write a profile of the run's allocations to this file at its end (go tool pprof -sample_index=alloc_space)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var clientPoke gendurable.PokeTransport
	switch *poke {
	case "local":
	case "postgres":
		clientPoke = gendurable.PokePostgres()
	default:
		return fmt.Errorf("--poke %q: local or postgres", *poke)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		defer func() {
			if err := writeAllocs(*memProfile); err != nil {
				fmt.Fprintln(os.Stderr, "gendurable bench: memory profile:", err)
			}
		}()
	}
	var sampleOut io.Writer
	if *samples != "" && *worker == "" {
		f, ferr := os.Create(*samples)
		if ferr != nil {
			return fmt.Errorf("--samples: %w", ferr)
		}
		bw := bufio.NewWriter(f)
		defer func() {
			// A samples file cut short (a full disk) fails the run, as a failed scenario does.
			if cerr := errors.Join(bw.Flush(), f.Close()); cerr != nil {
				err = errors.Join(err, fmt.Errorf("--samples: %w", cerr))
			}
		}()
		if _, werr := io.WriteString(bw, "scenario,at_ms,total_ms,insert_ms\n"); werr != nil {
			return fmt.Errorf("--samples: %w", werr)
		}
		sampleOut = bw
	}
	pool, closeDB, err := db.open(ctx, *worker == "", os.Stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	if *worker != "" {
		return bench.Work(ctx, pool, db.schema, *worker, *conc, quietLogger(), os.Stdin, out)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	url := pool.Config().ConnString()
	workerCmd := func(scenario string) *exec.Cmd {
		return exec.CommandContext(ctx, exe, "bench", "--worker", scenario, "--database-url", url, "--schema", db.schema,
			"--concurrency", strconv.Itoa(*conc))
	}
	var codec gendurable.Codec
	if *sealed {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return err
		}
		if codec, err = gendurable.NewAESGCM("bench", map[string][]byte{"bench": key}); err != nil {
			return err
		}
	}
	var results []bench.Result
	err = bench.Run(ctx, pool, bench.Options{Schema: db.schema, Scenarios: scenarios, N: *n, Concurrency: *conc, Prefetch: *prefetch,
		Clients: *clients, Processes: *processes, Worker: workerCmd, Preload: *preload, PreloadLive: *preloadLive, Duration: *duration, Rate: *rate, Window: *window, Retention: *retention,
		Codec: codec, ClientPoke: clientPoke, Logger: quietLogger(), Samples: sampleOut},
		func(r bench.Result) {
			if r.Partial {
				if *asJSON {
					_ = bench.WriteJSON(out, r)
				} else {
					bench.WriteWindow(out, *r.Window)
				}
				return
			}
			results = append(results, r)
			if *asJSON {
				_ = bench.WriteJSON(out, r)
			} else {
				fmt.Fprintf(os.Stderr, "  %s done\n", r.Scenario)
			}
		})
	if !*asJSON {
		bench.WriteTable(out, results)
	}
	return err
}

// writeAllocs writes the heap profile, which holds every allocation sampled since the process
// began (alloc_space, alloc_objects) beside what is live.
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
