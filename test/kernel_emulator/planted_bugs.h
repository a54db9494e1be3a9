// Kernels with planted bugs (planted_bugs.cpp), run on the kernel emulator in the order EMULATOR_ORDER names.
#pragma once
#include <string>
#include <vector>

struct PlantedBug {
    std::string name;
    std::string error;                // what the launch threw ("" if nothing)
    std::vector<std::string> places;  // what the error must name: the kind of bug, the kernel, the source lines
};
std::vector<PlantedBug> planted_bugs();
// The same kernels without their bugs (a raised shared-memory limit included): "" when nothing is reported.
std::string run_without_bugs();
