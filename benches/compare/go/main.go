// Command go-bench is Go's side of fibra-compare: it runs one BENCH.md workload with the
// GOMAXPROCS it is given and prints one "value <figure>" line per repetition (the same
// protocol as the Rust children, with "also <row> <figure>" lines for the rows derived from
// the workload), or serves the http workload until it is killed.
//
//	go-bench -w skynet -reps 5 [-warmup=false]
//	go-bench -w http -port 8080
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

// warmUpFor is how long a child warms up, as the Rust children's WARM_UP_FOR (measure.rs):
// the kernel places a fresh process's busy threads for its first tens of milliseconds.
const warmUpFor = 200 * time.Millisecond

// warmUp runs rep untimed once, then again until warmUpFor has passed.
func warmUp(rep func()) {
	start := time.Now()
	rep()
	for time.Since(start) < warmUpFor {
		rep()
	}
}

func main() {
	workload := flag.String("w", "", "workload name")
	reps := flag.Int("reps", 5, "repetitions")
	warmup := flag.Bool("warmup", true, "run untimed first, once and until warmUpFor has passed")
	port := flag.Int("port", 0, "http: port on 127.0.0.1")
	flag.Parse()

	if *workload == "http" {
		if err := serveHTTP(*port); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if run, ok := workloads[*workload]; ok {
		if *warmup {
			warmUp(func() { run() })
		}
		for i := 0; i < *reps; i++ {
			fmt.Printf("value %g\n", run())
		}
		return
	}
	if run, ok := multiWorkloads[*workload]; ok {
		if *warmup {
			warmUp(func() { run() })
		}
		for i := 0; i < *reps; i++ {
			value, also := run()
			fmt.Printf("value %g\n", value)
			for _, a := range also {
				fmt.Printf("also %s %g\n", a.row, a.value)
			}
		}
		return
	}
	fmt.Printf("skip no Go version of workload %q\n", *workload)
}
