/* OpenMPI's own MPI_Allreduce, the peer of benches/ranked_allreduce.rs:
 * the same bytes per rank (f32 sum, in place), the same rounds, timed the
 * same way (a barrier, then the collective; each round's time is the
 * slowest rank's). Prints one JSON object.
 *
 *   mpicc -O2 -o target/mpi_allreduce benches/mpi_allreduce.c
 *   mpirun -n 2 target/mpi_allreduce BYTES ROUNDS
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    long bytes = argc > 1 ? atol(argv[1]) : 16L << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 20;
    long n = bytes / 4;
    bytes = n * 4; /* whole floats: the bytes reported are the bytes reduced */
    float *buf = malloc((size_t)n * sizeof(float));
    double *times = malloc((size_t)rounds * sizeof(double));
    for (long i = 0; i < n; i++) buf[i] = (float)((i + rank) % 97) * 0.01f;
    for (int w = 0; w < 3; w++)
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int r = 0; r < rounds; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = MPI_Wtime() - t0, slowest;
        MPI_Reduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        times[r] = slowest;
    }
    if (rank == 0) {
        qsort(times, (size_t)rounds, sizeof(double), by_value);
        double median = times[rounds / 2];
        double busbw = 2.0 * (ranks - 1) / ranks * (double)bytes / median;
        printf("{\"peer\":\"MPI_Allreduce\",\"ranks\":%d,\"bytes\":%ld,\"rounds\":%d,"
               "\"median_seconds\":%.9f,\"min_seconds\":%.9f,\"busbw_bytes_per_s\":%.1f}\n",
               ranks, bytes, rounds, median, times[0], busbw);
    }
    free(buf);
    free(times);
    MPI_Finalize();
    return 0;
}
