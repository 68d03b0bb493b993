package transport_test

import (
	"os"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) {
	// A fleet worker is this test binary started again by TestFleet: it runs
	// its share of the workload and exits before any test is run.
	if os.Getenv(fleetWorkerEnv) != "" {
		os.Exit(fleetWorker())
	}
	if os.Getenv(restartWorkerEnv) != "" { // TestFleetRedisRestart's
		os.Exit(restartWorker())
	}
	if os.Getenv(limitersWorkerEnv) != "" { // TestFleetAgainstRealLimiters'
		os.Exit(limitersWorker())
	}
	if os.Getenv(modelsWorkerEnv) != "" { // TestFleetModels'
		os.Exit(modelsWorker())
	}
	if os.Getenv(flightWorkerEnv) != "" { // TestInFlightFleet's
		os.Exit(flightWorker())
	}
	if os.Getenv(ceilingWorkerEnv) != "" { // TestGeminiFleet's
		os.Exit(ceilingWorker())
	}
	redistest.Main(m)
}
