// The Go versions of BENCH.md's workloads, written like the Rust ones in src/workloads/: each
// function runs one repetition and returns its figure in the workload's unit.
package main

import (
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var workloads = map[string]func() float64{
	"spawn_many":     spawnMany,
	"spawn_remote":   spawnRemote,
	"spawn_join":     spawnJoin,
	"yield_many":     yieldMany,
	"ping_pong":      pingPong,
	"ping_pong_mpsc": pingPongMpsc,
	"chained_spawn":  chainedSpawn,
	"skynet":         skynet,
	"sleep_storm":    sleepStorm,
	"timer_p50":      func() float64 { return timerLateness(50) },
	"timer_p99":      func() float64 { return timerLateness(99) },
	"idle_cpu":       idleCPU,
	"park_memory":    parkMemory,
	"join_chain":     joinChain,
}

// A figure for a row derived from a workload (the harness's Mode::Derived rows).
type derived struct {
	row   string
	value float64
}

// Workloads whose repetitions also give figures for derived rows.
var multiWorkloads = map[string]func() (float64, []derived){
	"million_park": millionPark,
}

func nsPer(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / float64(n) }

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// spawn_many: a goroutine spawns 10 000 goroutines that decrement a counter; the last signals.
func spawnMany() float64 {
	const tasks = 10000
	rem := int64(tasks)
	done := make(chan struct{}, 1)
	start := time.Now()
	go func() {
		for i := 0; i < tasks; i++ {
			go func() {
				if atomic.AddInt64(&rem, -1) == 0 {
					done <- struct{}{}
				}
			}()
		}
	}()
	<-done
	return nsPer(time.Since(start), tasks)
}

// spawn_remote: the main goroutine (Go has no plain threads) starts 10 000 empty goroutines
// and joins them with a WaitGroup.
func spawnRemote() float64 {
	const tasks = 10000
	var wg sync.WaitGroup
	start := time.Now()
	wg.Add(tasks)
	for i := 0; i < tasks; i++ {
		go wg.Done()
	}
	wg.Wait()
	return nsPer(time.Since(start), tasks)
}

// spawn_join: the main goroutine starts one empty goroutine and waits for it (a channel of
// capacity 1) before starting the next, 2 000 times.
func spawnJoin() float64 {
	const roundTrips = 2000
	done := make(chan struct{}, 1)
	start := time.Now()
	for i := 0; i < roundTrips; i++ {
		go func() { done <- struct{}{} }()
		<-done
	}
	return nsPer(time.Since(start), roundTrips)
}

// yield_many: 200 goroutines each call runtime.Gosched 1 000 times.
func yieldMany() float64 {
	const tasks, yields = 200, 1000
	done := make(chan struct{}, tasks)
	start := time.Now()
	for i := 0; i < tasks; i++ {
		go func() {
			for j := 0; j < yields; j++ {
				runtime.Gosched()
			}
			done <- struct{}{}
		}()
	}
	for i := 0; i < tasks; i++ {
		<-done
	}
	return nsPer(time.Since(start), tasks*yields)
}

// ping_pong: 1 000 pairs; each pair's first goroutine spawns its partner and they exchange a
// ping and a pong over two capacity-1 channels used as oneshots.
func pingPong() float64 {
	const pairs = 1000
	rem := int64(pairs)
	done := make(chan struct{}, 1)
	start := time.Now()
	go func() {
		for i := 0; i < pairs; i++ {
			go func() {
				ping, pong := make(chan struct{}, 1), make(chan struct{}, 1)
				go func() {
					<-ping
					pong <- struct{}{}
				}()
				ping <- struct{}{}
				<-pong
				if atomic.AddInt64(&rem, -1) == 0 {
					done <- struct{}{}
				}
			}()
		}
	}()
	<-done
	return nsPer(time.Since(start), pairs)
}

// ping_pong_mpsc: 200 pairs; each pair's first goroutine spawns its partner and they make 50
// round trips over two capacity-1 channels (the number goes one way, plus one comes back).
func pingPongMpsc() float64 {
	const pairs, roundTrips = 200, 50
	rem := int64(pairs)
	done := make(chan struct{}, 1)
	start := time.Now()
	go func() {
		for i := 0; i < pairs; i++ {
			go func() {
				ping, pong := make(chan int, 1), make(chan int, 1)
				go func() {
					for n := range ping {
						pong <- n + 1
					}
				}()
				for n := 0; n < roundTrips; n++ {
					ping <- n
					if <-pong != n+1 {
						panic("ping_pong_mpsc: wrong answer")
					}
				}
				close(ping)
				if atomic.AddInt64(&rem, -1) == 0 {
					done <- struct{}{}
				}
			}()
		}
	}()
	<-done
	return nsPer(time.Since(start), pairs*roundTrips)
}

// chained_spawn: each goroutine starts the next, 1 000 deep; the last signals.
func chainedSpawn() float64 {
	const depth = 1000
	done := make(chan struct{}, 1)
	var hop func(n int)
	hop = func(n int) {
		if n == 0 {
			done <- struct{}{}
			return
		}
		go hop(n - 1)
	}
	start := time.Now()
	go hop(depth)
	<-done
	return nsPer(time.Since(start), depth)
}

// join_chain: each goroutine starts the next and waits for its result, 2 000 deep, so 2 000
// goroutines are alive at once; the result (the depth) is checked. Goroutines have no join
// handle: each hop hands its result up on a channel of capacity 1.
func joinChain() float64 {
	const depth = 2000
	var hop func(n int, result chan<- int)
	hop = func(n int, result chan<- int) {
		if n == 0 {
			result <- 0
			return
		}
		child := make(chan int, 1)
		go hop(n-1, child)
		result <- <-child + 1
	}
	start := time.Now()
	root := make(chan int, 1)
	go hop(depth, root)
	got := <-root
	elapsed := time.Since(start)
	if got != depth {
		panic("join_chain: depth " + strconv.Itoa(got))
	}
	return nsPer(elapsed, depth)
}

// skynet: a 10-ary tree of goroutines with 1 000 000 leaves; inner nodes sum their children.
func skynet() float64 {
	const leaves, fanout = 1000000, 10
	var node func(out chan<- int64, num, size int64)
	node = func(out chan<- int64, num, size int64) {
		if size == 1 {
			out <- num
			return
		}
		step := size / fanout
		children := make(chan int64, fanout)
		for i := int64(0); i < fanout; i++ {
			go node(children, num+i*step, step)
		}
		var sum int64
		for i := 0; i < fanout; i++ {
			sum += <-children
		}
		out <- sum
	}
	start := time.Now()
	root := make(chan int64, 1)
	go node(root, 0, leaves)
	sum := <-root
	elapsed := time.Since(start)
	if sum != leaves*(leaves-1)/2 {
		panic("skynet: wrong sum " + strconv.FormatInt(sum, 10))
	}
	return ms(elapsed)
}

// sleep_storm: 10 000 goroutines each sleep 10 ms five times; figure is ms beyond 50 ms.
func sleepStorm() float64 {
	const tasks, sleeps = 10000, 5
	var wg sync.WaitGroup
	wg.Add(tasks)
	start := time.Now()
	for i := 0; i < tasks; i++ {
		go func() {
			for j := 0; j < sleeps; j++ {
				time.Sleep(10 * time.Millisecond)
			}
			wg.Done()
		}()
	}
	wg.Wait()
	return ms(time.Since(start)) - 50
}

// timer_p50 / timer_p99: 10 000 goroutines each sleep 10 ms once, together; figure is the
// given percentile of how late they woke, in µs.
func timerLateness(pct int) float64 {
	const tasks = 10000
	late := make([]float64, tasks)
	var wg sync.WaitGroup
	wg.Add(tasks)
	for i := 0; i < tasks; i++ {
		go func(i int) {
			t := time.Now()
			time.Sleep(10 * time.Millisecond)
			late[i] = float64((time.Since(t) - 10*time.Millisecond).Nanoseconds()) / 1e3
			wg.Done()
		}(i)
	}
	wg.Wait()
	sort.Float64s(late)
	return late[tasks*pct/100]
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// idle_cpu: after one goroutine has run, the process idles for 2 s; figure is CPU ms used.
func idleCPU() float64 {
	done := make(chan struct{})
	go func() { close(done) }()
	<-done
	before := processCPU()
	time.Sleep(2 * time.Second)
	return ms(processCPU() - before)
}

func rssKiB() float64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		panic(err)
	}
	pages, err := strconv.ParseInt(strings.Fields(string(b))[1], 10, 64)
	if err != nil {
		panic(err)
	}
	return float64(pages * int64(os.Getpagesize()) / 1024)
}

// park_memory: 100 000 goroutines blocked on one channel at once; figure is RSS KiB each.
func parkMemory() float64 {
	const tasks = 100000
	release := make(chan struct{})
	var parked int64
	var wg sync.WaitGroup
	wg.Add(tasks)
	base := rssKiB()
	for i := 0; i < tasks; i++ {
		go func() {
			atomic.AddInt64(&parked, 1)
			<-release
			wg.Done()
		}()
	}
	deadline := time.Now().Add(20 * time.Second)
	for atomic.LoadInt64(&parked) != tasks {
		if time.Now().After(deadline) {
			panic("park_memory: goroutines did not all park")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	perTask := (rssKiB() - base) / tasks
	close(release)
	wg.Wait()
	return perTask
}

// million_park: 1 000 000 goroutines started by the main goroutine, each counting itself in and
// blocking on one channel; the one that completes the count signals. Figures, µs per
// goroutine: start until all counted in (million_park), then close(channel) until the
// WaitGroup says all have ended (million_wake).
func millionPark() (float64, []derived) {
	const tasks = 1000000
	release := make(chan struct{})
	all := make(chan struct{}, 1)
	var parked int64
	var wg sync.WaitGroup
	wg.Add(tasks)
	start := time.Now()
	for i := 0; i < tasks; i++ {
		go func() {
			if atomic.AddInt64(&parked, 1) == tasks {
				all <- struct{}{}
			}
			<-release
			wg.Done()
		}()
	}
	select {
	case <-all:
	case <-time.After(150 * time.Second):
		panic("million_park: only " + strconv.FormatInt(atomic.LoadInt64(&parked), 10) +
			" goroutines parked")
	}
	spawnPark := time.Since(start)
	woke := time.Now()
	close(release)
	wg.Wait()
	wakeJoin := time.Since(woke)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / tasks }
	return us(spawnPark), []derived{{"million_wake", us(wakeJoin)}}
}
