import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout


class SpeculaTestConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        tc = CMakeToolchain(self)
        specula = self.dependencies["specula"]
        tc.cache_variables["SPECULA_TEST_TESTING"] = bool(specula.options.with_testing)
        tc.cache_variables["SPECULA_TEST_CUDA"] = bool(specula.options.with_cuda)
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if can_run(self):
            for exe in ("test_package", "test_package_testing", "test_package_cuda"):
                path = os.path.join(self.cpp.build.bindir, exe)
                if os.path.exists(path) or os.path.exists(path + ".exe"):
                    self.run(path, env="conanrun")
